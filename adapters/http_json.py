"""JSON calls to a loraserve server, as the command-line clients make them: the key from
LORASERVE_API_KEY, and any refusal or network failure as one line naming what went wrong.

Imports httpx only, so a command that talks to a server starts without torch.
"""

from __future__ import annotations

import httpx

KEY_VAR = "LORASERVE_API_KEY"
DEFAULT_SERVER = "http://127.0.0.1:8000"
TIMEOUT = httpx.Timeout(60.0, write=600.0)  # large adapters and batch files take a while


class RemoteError(Exception):
    """A request the server refused or that could not reach it; the message is one line."""


def call_json(client: httpx.Client, method: str, path: str, *, key: str | None, **kwargs) -> dict:
    """The server's JSON answer to method path; RemoteError with its message if refused."""
    try:
        response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise RemoteError(f"cannot reach the server at {client.base_url}: {exc}") from None
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.is_success and isinstance(body, dict):
        return body
    message = error_message(body) or f"the server answered HTTP {response.status_code}"
    if response.status_code == 401 and not key:
        message += f" (set {KEY_VAR})"
    raise RemoteError(message)


def error_message(body: object) -> str | None:
    """The message of an OpenAI-style or Workers-AI-style error body (every error, joined)."""
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    errors = body.get("errors")
    if isinstance(errors, list):
        messages = [str(e.get("message")) for e in errors if isinstance(e, dict)]
        return "; ".join(messages) or None
    if isinstance(body.get("detail"), str):  # a framework error that bypassed the API's shapes
        return body["detail"]
    return None
