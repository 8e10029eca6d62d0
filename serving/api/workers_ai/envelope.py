"""Cloudflare's envelope for a success: {"result", "success", "errors", "messages"}, and a
paged list's `result_info`. (Errors take the same envelope in serving.api.core.errors.)"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def envelope(result: object, messages: Iterable[str] = ()) -> dict:
    """A successful answer; messages, notes for the caller (Cloudflare's {code, message})."""
    notes = [{"code": 0, "message": m} for m in messages]
    return {"result": result, "success": True, "errors": [], "messages": notes}


def paged(rows: Sequence, page: int, per_page: int) -> dict:
    """Page `page` of rows in Cloudflare's paged-list answer (an empty page past the last,
    which ends the SDK's iteration)."""
    shown = list(rows[(page - 1) * per_page : page * per_page])
    info = {"page": page, "per_page": per_page, "count": len(shown), "total_count": len(rows)}
    return {**envelope(shown), "result_info": info}
