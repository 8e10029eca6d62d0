"""A deliberately simple float64 reference for the LoRA ops: what every path must compute.

No segments, no sorting: every token gathers its own adapter's matrices and
multiplies them in float64. Entries an op must leave alone come back NaN. The tests check
each path against it, and bench/gpu_checks.py the Triton path on a GPU; nothing serves with it.
"""

from __future__ import annotations

import torch


def _rank_mask(slot_ids, slot_ranks, max_rank):
    """[num_tokens, max_rank] bool: column j is live for token t iff slot(t) >= 0 and j < rank."""
    slots = slot_ids.long()
    ranks = torch.where(slots >= 0, slot_ranks.long()[slots.clamp(min=0)], 0)
    return torch.arange(max_rank)[None, :] < ranks[:, None]


def shrink_oracle(x, lora_a, slot_ids, slot_ranks):
    """t[s, tok, j] = sum_k x[tok, k] * A_s[slot(tok), j, k] for j < rank(slot); NaN elsewhere."""
    slots = slot_ids.long().clamp(min=0)
    live = _rank_mask(slot_ids, slot_ranks, lora_a[0].shape[1])
    out = []
    for a in lora_a:
        a_tok = a.double().nan_to_num(0.0)[slots]  # [num_tokens, max_rank, hidden]
        t = torch.einsum("trk,tk->tr", a_tok, x.double())
        out.append(torch.where(live, t, torch.nan))
    return torch.stack(out)  # [num_slices, num_tokens, max_rank]


def expand_oracle(y, t, lora_b, slot_ids, slot_ranks, scales):
    """y[tok, slice s] + scale(slot) * sum_{j < rank} t[s, tok, j] * B_s[slot, j, :], in float64."""
    slots = slot_ids.long().clamp(min=0)
    live = _rank_mask(slot_ids, slot_ranks, lora_b[0].shape[1])
    scale = torch.where(slot_ids >= 0, scales.double()[slots], 0.0)[:, None]  # [num_tokens, 1]
    parts = []
    for s, b in enumerate(lora_b):
        ts = torch.where(live, t[s].double(), 0.0)  # columns past the rank never count
        b_tok = b.double().nan_to_num(0.0)[slots]  # [num_tokens, max_rank, width]
        parts.append(scale * torch.einsum("tr,trn->tn", ts, b_tok))
    return y.double() + torch.cat(parts, dim=1)
