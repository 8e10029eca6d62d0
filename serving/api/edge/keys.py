"""The app's API keys, checked: a presented key to its caller, in time that does not tell
where a wrong key differs from a right one, and too many wrong keys from one client refused
for a while (key_guesses). The keys themselves are configured in serving.api.core.keys_file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Mapping

from serving.api.core.caller import OPEN, Principal, key_id
from serving.api.core.errors import ApiError
from serving.api.edge.key_guesses import KeyGuesses

_CHALLENGE = {"WWW-Authenticate": "Bearer"}


class KeyRing:
    """Looks keys up in time independent of where a presented key differs from a real one."""

    def __init__(self, keys: Mapping[str, Principal]) -> None:
        # Compare fixed-length digests, every one of them, so neither the position of the
        # first differing byte nor which key matched shows in the time taken.
        # Each principal carries its key's public id, however it was built.
        self._entries = [
            (_digest(k), p if p.key_id else dataclasses.replace(p, key_id=key_id(k)))
            for k, p in keys.items()
        ]
        self.guesses = KeyGuesses()  # wrong keys per client, shared by the gate and routes

    @property
    def open(self) -> bool:
        return not self._entries

    @property
    def secret(self) -> bytes:
        """Bytes only the holders of the keys can compute, alike in every process."""
        return hashlib.sha256(b"".join(sorted(d for d, _ in self._entries))).digest()

    def holder(self, key_id: str) -> Principal | None:
        """The caller whose key has this public id (see key_id), None if no key has."""
        return next((p for _, p in self._entries if p.key_id == key_id), None)

    def lookup(self, key: str) -> Principal | None:
        presented, found = _digest(key), None
        for digest, principal in self._entries:
            if hmac.compare_digest(presented, digest):
                found = principal
        return found

    def identify(self, authorization: str | None, client: str = "") -> Principal:
        """The caller an Authorization header names; 401 unless it is `Bearer KEY` with a
        known KEY, 429 while client (core.caller.client_of) has sent too many wrong keys."""
        if self.open:
            return OPEN
        scheme, _, key = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(
                401,
                "missing API key: send the header Authorization: Bearer KEY",
                code="invalid_api_key",
                headers=_CHALLENGE,
            )
        wait = self.guesses.retry_after(client)
        if wait is not None:
            raise ApiError(
                429,
                f"too many invalid API keys from this address: try again in {wait} s",
                code="too_many_invalid_keys",
                headers={"Retry-After": str(wait)},
            )
        principal = self.lookup(key.strip())
        if principal is None:
            self.guesses.wrong(client)
            raise ApiError(401, "invalid API key", code="invalid_api_key", headers=_CHALLENGE)
        return principal


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
