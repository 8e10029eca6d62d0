"""PEFT's trainable tokens: an adapter's own embedding rows for a few token ids.

    adapter_config.json        trainable_token_indices: [id, ...] or {"embed_tokens": [...]}
    adapter_model.safetensors  ...embed_tokens.token_adapter.trainable_tokens_delta [n, hidden]

Despite its name the tensor holds the rows themselves, not differences: a token whose id
is listed embeds as its row (and, where the model ties its LM head to the embedding, that
row is also the token's LM-head row), as PEFT computes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adapters.errors import AdapterError, quoted

MAX_TOKENS = 65_536  # no vocabulary is larger; the slab bounds what it serves far lower


@dataclass(frozen=True)
class TrainableTokens:
    """rows[i] is the embedding of token ids[i]."""

    ids: torch.Tensor  # [n] int64, distinct
    rows: torch.Tensor  # [n, hidden]


def token_indices(config: dict, label: str) -> tuple[int, ...]:
    """trainable_token_indices as a tuple of distinct ids (empty when unset)."""
    value = config.get("trainable_token_indices")
    if value in (None, [], {}):
        return ()
    if isinstance(value, dict):
        keys = set(value) - {"embed_tokens", "model.embed_tokens"}
        if keys or len(value) != 1:
            raise AdapterError(
                f"{label}: trainable_token_indices: only embed_tokens is supported, got "
                f"{', '.join(quoted(k) for k in sorted(map(str, value)))}"
            )
        (value,) = value.values()
    if not isinstance(value, list) or len(value) > MAX_TOKENS:
        raise AdapterError(f"{label}: trainable_token_indices must be a list of token ids")
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise AdapterError(
                f"{label}: trainable_token_indices: {quoted(v)} is not a token id (an integer >= 0)"
            )
    if len(set(value)) != len(value):
        raise AdapterError(f"{label}: trainable_token_indices lists a token id twice")
    return tuple(value)


def read_tokens(
    ids: tuple[int, ...], rows: torch.Tensor | None, label: str, vocab: int, hidden: int | None
) -> TrainableTokens | None:
    """The adapter's TrainableTokens, checked against the config's ids and the base model."""
    if not ids and rows is None:
        return None
    if rows is None:
        raise AdapterError(
            f"{label}: trainable_token_indices is set but trainable_tokens_delta is missing"
        )
    if not ids:
        raise AdapterError(
            f"{label}: has trainable_tokens_delta but trainable_token_indices is not set"
        )
    if rows.dim() != 2 or rows.shape[0] != len(ids) or (hidden and rows.shape[1] != hidden):
        want = f"[{len(ids)}, {hidden or 'hidden'}]"
        raise AdapterError(
            f"{label}: trainable_tokens_delta {tuple(rows.shape)} does not fit {want} "
            "(one row per trainable_token_indices id)"
        )
    if vocab and max(ids) >= vocab:
        raise AdapterError(
            f"{label}: trainable_token_indices: token id {max(ids)} is outside the base "
            f"model's vocabulary of {vocab}"
        )
    return TrainableTokens(torch.tensor(ids, dtype=torch.int64), rows)
