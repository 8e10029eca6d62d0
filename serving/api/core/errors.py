"""Every error the API answers, as JSON in the style of the route that was asked.

    /ai/... and Cloudflare's paths (serving.api.core.cloudflare_paths)
                 {"success": false, "errors": [{"code": 400, "message": "..."}],
                  "messages": [], "result": null}
    elsewhere    {"error": {"message": "...", "type": "invalid_request_error", "param": null,
                            "code": null}}

`param` names the field at fault when one is (a validation error), as OpenAI's errors do.

Workers-AI error codes are the HTTP status. Bad input of any kind (validation, malformed
JSON, a wrong content type, bytes that are not UTF-8) is a 400; an unexpected fault is a
500 whose body says only that, the traceback going to the log.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Send

from serving.api.core.cloudflare_paths import is_cloudflare_shaped

log = logging.getLogger("loraserve.api")

# OpenAI's error `type` by HTTP status
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """An answer other than success: HTTP status, a message for the client, an OpenAI code."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = dict(headers or {})

    def __reduce__(self):
        # Pickled whole: raised in another deployment (the Batch one), it crosses Ray to the
        # route intact. Without this, unpickling calls ApiError(message) and fails, and Ray
        # hands over a stand-in that no route recognises.
        return type(self), (self.status, self.message, self.code, self.headers, self.param)


def error_body(
    path: str, status: int, message: str, code: str | None = None, param: str | None = None
) -> dict:
    """The JSON body of an error answered on path."""
    if is_cloudflare_shaped(path):
        errors = [{"code": status, "message": message}]
        return {"success": False, "errors": errors, "messages": [], "result": None}
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


async def send_error(
    send: Send,
    path: str,
    status: int,
    message: str,
    code: str | None = None,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    """Answer error_body from raw ASGI middleware, which answers before reading the body."""
    body = json.dumps(error_body(path, status, message, code)).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),  # the unread rest of the body cannot be skipped
        *headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def error_response(request: Request, error: ApiError) -> JSONResponse:
    body = error_body(request.url.path, error.status, error.message, error.code, error.param)
    return JSONResponse(body, status_code=error.status, headers=error.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error of app through error_body."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(request, exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such route: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        elif message == "There was an error parsing the body":
            message = _parse_failure(exc.__cause__)
        headers = getattr(exc, "headers", None)
        return error_response(request, ApiError(exc.status_code, message, headers=headers))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message = describe_validation(exc)
        return error_response(request, ApiError(400, message, param=_param(exc, message)))

    @app.exception_handler(Exception)
    async def _fault(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(request, ApiError(500, "internal server error"))


def _parse_failure(cause: BaseException | None) -> str:
    """Why FastAPI could not parse a JSON body, from the exception it wrapped."""
    if isinstance(cause, RecursionError):
        return "the JSON body nests too deeply"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        # int(): "Exceeds the limit (4300 digits) for integer string conversion"
        return "the JSON body holds a number with too many digits"
    return "the body could not be read as JSON text (is it UTF-8?)"


def describe_validation(exc: RequestValidationError) -> str:
    """Pydantic's errors as one line: 'field.path: message; ...' (at most three)."""
    parts = []
    for err in exc.errors():
        kind, loc = err.get("type"), tuple(err.get("loc", ()))
        if kind == "json_invalid":
            detail = (err.get("ctx") or {}).get("error", "invalid JSON")
            where = f" at character {loc[1]}" if len(loc) > 1 else ""
            return f"the body is not valid JSON: {detail}{where}"
        if loc == ("body",) and isinstance(err.get("input"), bytes | bytearray):
            return "the body must be a JSON object sent with Content-Type: application/json"
        if loc == ("body",) and kind == "missing":
            return "a JSON body is required"
        fields = _fields(loc)
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        # our validators' messages already start with the field's name; a field within an
        # item keeps the item's path ("requests.3.max_tokens must be at least 1")
        if fields and msg.startswith((f"{fields[-1]} ", f"{fields[-1]}: ")):
            parts.append(".".join([*fields[:-1], msg]))
        else:
            parts.append(f"{'.'.join(fields)}: {msg}" if fields else msg)
    unique = list(dict.fromkeys(parts))
    return "; ".join(unique[:3]) or "invalid request"


# A message that opens with a field path ("input[0].content: ...", "max_tokens must ...")
_LEADING_FIELD = re.compile(r"([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+|\[\d+\])*)(?::| must | is )")


def _param(exc: RequestValidationError, message: str) -> str | None:
    """The field the first error is about, for OpenAI's `param`: its place in the body, or
    for a check of the whole body, the field its message opens with."""
    errors = exc.errors()
    if errors and errors[0].get("type") == "json_invalid":  # its location is a character offset
        return None
    fields = _fields(tuple(errors[0].get("loc", ()))) if errors else []
    if fields:
        return ".".join(fields)
    match = _LEADING_FIELD.match(message)
    return match.group(1) if match else None


def _fields(loc: tuple) -> list[str]:
    """The field path of an error's location in a request ([] for the body as a whole)."""
    if loc[:1] == ("body",):
        return [_shown(p) for p in loc[1:] if not _is_union_tag(p)]
    if loc[:1] in (("query",), ("path",), ("header",)):
        return [_shown(p) for p in loc[1:]]
    return []


def _shown(part: object, limit: int = 64) -> str:
    """A location part as the message shows it: a client's dict key may be long, or hold a
    lone surrogate that no JSON answer can encode."""
    text = str(part)
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _is_union_tag(part: object) -> bool:
    # pydantic names the union member that failed ("str", "list[int]") inside the location
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool"))
