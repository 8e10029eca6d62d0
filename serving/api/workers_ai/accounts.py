"""Cloudflare's accounts are tenants: the account in a path is the key's own tenant, and
the account API routes that Cloudflare's clients call first answer from our keys.

    GET /user/tokens/verify                   the key is active ({"id", "status": "active"})
    GET /accounts/{account_id}/tokens/verify  the same, for a key of that account
    GET /memberships                          the one account the key acts in: its tenant

(each also under /client/v4, where wrangler's CLOUDFLARE_API_BASE_URL points). An account
id that is not the key's tenant, another tenant's or one that never existed, answers the
same 404: a key acts only in its own account, admin keys included (they manage other
tenants' adapters through /v1/adapters?tenant=).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from adapters.errors import quoted
from serving.api.core.caller import Principal, authenticate
from serving.api.core.cloudflare_paths import ACCOUNT_API, CLOUDFLARE_ROOT
from serving.api.core.errors import ApiError
from serving.api.workers_ai.envelope import envelope, paged

router = APIRouter(tags=["Cloudflare accounts"])
Caller = Annotated[Principal, Depends(authenticate)]
VERIFY, MEMBERSHIPS = ACCOUNT_API


def in_account(account_id: str, caller: Caller) -> Principal:
    """The caller, once the path's account is its own; else 404 as for no such account."""
    if account_id != caller.tenant:
        raise ApiError(404, f"unknown account {quoted(account_id)}: a key acts in its own "
                            f"account, whose id {MEMBERSHIPS} answers")  # fmt: skip
    return caller


@router.get(VERIFY, summary="Verify the key (Cloudflare)")
@router.get(CLOUDFLARE_ROOT + VERIFY, include_in_schema=False)
async def verify_token(caller: Caller):
    return envelope({"id": caller.key_id, "status": "active"})


@router.get("/accounts/{account_id}/tokens/verify", summary="Verify an account's key")
@router.get(CLOUDFLARE_ROOT + "/accounts/{account_id}/tokens/verify", include_in_schema=False)
async def verify_account_token(caller: Annotated[Principal, Depends(in_account)]):
    return envelope({"id": caller.key_id, "status": "active"})


@router.get(MEMBERSHIPS, summary="The account this key acts in (Cloudflare)")
@router.get(CLOUDFLARE_ROOT + MEMBERSHIPS, include_in_schema=False)
async def memberships(
    caller: Caller,
    page: Annotated[int, Query(ge=1)] = 1,
    per_page: Annotated[int, Query(ge=1, le=1000)] = 20,
):
    account = {"id": caller.tenant, "name": caller.tenant}
    member = {"id": caller.tenant, "account": account, "status": "accepted",
              "roles": ["Administrator" if caller.is_admin else "Member"]}  # fmt: skip
    return paged([member], page, per_page)
