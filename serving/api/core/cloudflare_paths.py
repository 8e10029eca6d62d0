"""Cloudflare's paths: the Workers-AI wing answers at /ai/... and under Cloudflare's API
prefixes, and the routes of Cloudflare's account API that its clients call first.

    /ai/run/demo                               the wing's own path
    /accounts/<account>/ai/run/demo            the `cloudflare` SDK with base_url = the server
    /client/v4/accounts/<account>/ai/run/demo  wrangler with CLOUDFLARE_API_BASE_URL = .../client/v4
    /client/v4/user/tokens/verify, /client/v4/memberships (and without /client/v4)

Every one of these answers in Cloudflare's envelope, errors included.
"""

from __future__ import annotations

ACCOUNT_PREFIXES = ("/accounts", "/client/v4/accounts")  # each followed by /{account_id}
# Cloudflare's account API beside the wing: the token check, the caller's accounts
ACCOUNT_API = ("/user/tokens/verify", "/memberships")
CLOUDFLARE_ROOT = "/client/v4"


def ai_path(path: str) -> str | None:
    """The wing's own path ("/ai/...") that path names, None if it names none."""
    if path == "/ai" or path.startswith("/ai/"):
        return path
    for prefix in ACCOUNT_PREFIXES:
        if path.startswith(f"{prefix}/"):
            _account, sep, rest = path[len(prefix) + 1 :].partition("/")
            return f"/{rest}" if sep and (rest == "ai" or rest.startswith("ai/")) else None
    return None


def is_cloudflare_shaped(path: str) -> bool:
    """Whether path answers in Cloudflare's envelope ({"result", "success", "errors", ...})."""
    if ai_path(path) is not None or path.startswith(f"{CLOUDFLARE_ROOT}/"):
        return True
    accounts = ACCOUNT_PREFIXES[0]
    return path in (accounts, *ACCOUNT_API) or path.startswith(f"{accounts}/")
