"""A step's adapter terms outside the decoder layers: embedding LoRA and trainable tokens.

    embedding_lora:    h[t] += scale * B[slot t] @ A[slot t][:, id(t)]      (lora_embedding_A/B)
    own_token_rows:    h[t] = rows[slot t][id(t)]    where the slot's adapter lists id(t)
    own_token_logits:  logits[k, id] += out[k] @ (rows[slot k][id] - E[id])   tied LM head

(rows[slot] are those of the token slot the adapter in that slab slot holds:
adapters/slab/tokens.py.)

Base rows and rows whose adapter has none of these are untouched.
"""

from __future__ import annotations

import torch

from adapters.format.tensor_names import OUTER_LAYER
from kernels import lora_expand, lora_expand_planned
from serving.model.linear import StepLora


def embedding_lora(h: torch.Tensor, token_ids: torch.Tensor, slab, lora: StepLora) -> None:
    """h[t] += scale[slot t] * lora_embedding_B[slot t] @ lora_embedding_A[slot t][:, id(t)].

    The shrink of an embedding is a gather: column id(t) of A, [max_rank], per token.
    """
    if lora.segments.num_active == 0:
        return
    a = slab.lora_a(OUTER_LAYER, "embed_tokens")  # [slots, max_rank, vocab]
    slots = lora.segments.token_slots.to(torch.int64)  # [num_active], in segment order
    tokens = lora.segments.token_order  # [num_active]
    t = torch.zeros(h.shape[0], slab.max_rank, dtype=torch.float32, device=h.device)
    t[tokens] = a[slots, :, token_ids.index_select(0, tokens)].to(torch.float32)
    b = slab.lora_b(OUTER_LAYER, "embed_tokens")  # [slots, max_rank, hidden]
    if lora.checked:
        lora_expand(t, b, h, lora.segments, lora.scales)
    else:
        lora_expand_planned(t[None], (b,), h, lora.segments, lora.scales,
                            host_scales=lora.host_scales)  # fmt: skip


def own_token_rows(h: torch.Tensor, token_ids: torch.Tensor, slots: torch.Tensor, tokens) -> None:
    """h[t] = tokens.rows[k, i] for each token t whose slot's adapter, holding token slot k,
    lists id(t) as i.

    h: [T, hidden]; token_ids, slots: [T] (slot -1: base only); tokens: adapters.slab.tokens.
    """
    k = tokens.slots_of(slots)  # [T] int64, -1 where the adapter has no tokens
    index = tokens.where[k.clamp(min=0), token_ids]  # [T] int32, -1: not the adapter's id
    hit = ((k >= 0) & (index >= 0)).nonzero().squeeze(1)
    if hit.numel():
        h[hit] = tokens.rows[k[hit], index[hit].to(torch.int64)].to(h.dtype)


def own_token_logits(
    logits: torch.Tensor, out: torch.Tensor, slots: torch.Tensor, tokens, embed: torch.Tensor
) -> None:
    """With the LM head tied to the embedding, an adapter's own rows are its head rows too:
    logits[k, id] += out[k] @ (rows[slot k][id] - embed[id]) for the ids of its adapter.

    logits: [K, vocab]; out: [K, hidden]; slots: [K].
    """
    held = tokens.slots_of(slots)  # [K] int64, each row's token slot, -1: none
    rows = (held >= 0).nonzero().squeeze(1)  # [m]
    if rows.numel() == 0:
        return
    ids = tokens.ids[held[rows]]  # [m, max_tokens], -1 past each adapter's count
    valid = ids >= 0
    delta = tokens.rows[held[rows]].to(out.dtype) - embed[ids.clamp(min=0)]  # [m, n, hidden]
    add = torch.einsum("mh,mnh->mn", out[rows], delta)  # [m, n]
    k = rows[:, None].expand_as(ids)
    logits.index_put_((k[valid], ids[valid]), add[valid].to(logits.dtype), accumulate=True)
