"""JSON calls to a loraserve server, as the command-line clients make them: the key from
LORASERVE_API_KEY, and any refusal, network failure or malformed server URL or key as one
line naming what went wrong.

Imports httpx only, so a command that talks to a server starts without torch.
"""

from __future__ import annotations

import os
import re

import httpx

KEY_VAR = "LORASERVE_API_KEY"
DEFAULT_SERVER = "http://127.0.0.1:8000"
TIMEOUT = httpx.Timeout(60.0, write=600.0)  # large adapters and batch files take a while
# What a server accepts as a key (serving.api.core.keys_file): printable ASCII without spaces, which
# is also all an HTTP header can carry safely.
KEY_RE = re.compile(r"^[\x21-\x7e]+\Z")
URL_FORM = "http://HOST:PORT"


class RemoteError(Exception):
    """A request the server refused, one that could not reach it, or a server URL or key
    no request can be made with; the message is one line."""


def server_url(url: str) -> str:
    """url without its trailing '/', checked to be an http(s) URL with a host, so that a
    malformed one is named before any request rather than failing inside the client."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise RemoteError(f"invalid server URL {url!r} ({exc}): expected {URL_FORM}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise RemoteError(f"invalid server URL {url!r}: expected {URL_FORM}")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise RemoteError(f"invalid server URL {url!r}: port {parsed.port} is out of range")
    return url.rstrip("/")


def api_key(key: str | None = None) -> str | None:
    """The key to send (LORASERVE_API_KEY unless given), without surrounding whitespace (a
    key pasted or read from a file often ends in a newline); None when there is none.
    RemoteError if it holds characters no key can have; the key itself is never echoed."""
    key = (os.environ.get(KEY_VAR) if key is None else key) or ""
    key = key.strip()
    if not key:
        return None
    if not KEY_RE.match(key):
        raise RemoteError(
            f"{KEY_VAR} holds characters a key cannot have (keys are printable ASCII "
            "without spaces)"
        )
    return key


def open_client(url: str, key: str | None = None) -> tuple[httpx.Client, str | None]:
    """A client for the server at url sending the key (as api_key() finds it), and that key;
    RemoteError naming the problem if either is malformed. Nothing is sent yet."""
    url, key = server_url(url), api_key(key)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        return httpx.Client(base_url=url, headers=headers, timeout=TIMEOUT), key
    except (httpx.InvalidURL, TypeError, ValueError) as exc:  # whatever the checks above missed
        raise RemoteError(f"invalid server URL {url!r} ({exc}): expected {URL_FORM}") from None


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
