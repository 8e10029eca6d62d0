"""What the prefix cache keys a KV block on: its tokens, its parent block's hash, and the
request's adapter digest and cache salt (engine/kv_cache.py keeps the blocks)."""

from __future__ import annotations

import hashlib
import struct

from adapters.registry.names import version_digest

BlockKey = tuple[int | None, tuple[int, ...], str | None]  # (parent hash, tokens, adapter key)


def prefix_key(request) -> str | None:
    """What a request's blocks are keyed on beside their tokens: adapter digest and cache salt.

    The digest (not the name) keys the adapter's content, so a re-uploaded adapter never reads
    stale KV; the salt (the tenant) keeps hits within one tenant, so that cached_tokens tells
    no tenant whether another sent a prompt. None: the base model, unsalted.
    """
    adapter = request.adapter
    digest = version_digest(adapter) if adapter else None
    salt = request.cache_salt
    if salt is None:
        return digest
    # length-prefixed, so no salt and digest pair reads as another
    return f"salt:{len(salt)}:{salt}:{digest or ''}"


def hash_block(parent: int | None, token_ids: tuple[int, ...], adapter_key: str | None) -> int:
    """Stable 64-bit hash of one full block, chained on its parent block's hash."""
    h = hashlib.blake2b(digest_size=8)
    # Tagged, length-prefixed fields, so no two different inputs encode to the same bytes;
    # blake2b rather than hash(), whose str hashing is randomized per process.
    h.update(b"\x00" if parent is None else b"\x01" + parent.to_bytes(8, "little"))
    if adapter_key is None:
        h.update(b"\x00")
    else:
        key = adapter_key.encode()
        h.update(b"\x01" + len(key).to_bytes(4, "little") + key)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return int.from_bytes(h.digest(), "little")
