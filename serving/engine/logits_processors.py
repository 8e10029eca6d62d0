"""The logits processors: what turns a row's logits into the distribution a token is drawn from.

    logits -> logit bias -> repetition penalty (prompt + output)
           -> frequency / presence penalties (output)          apply_penalties
           -> temperature -> min-p -> top-k -> top-p           sampling_probs

Repetition penalty is CTRL's (Keskar et al. 2019) as HF applies it: a seen token's logit is
divided by the penalty when positive, multiplied when negative. Frequency and presence
penalties are OpenAI's: logit -= frequency * count + presence * (count > 0), over generated
tokens only. Top-p is the nucleus of Holtzman et al. 2019, taken after top-k has renormalized.
Every step is row-wise, so a row's result does not depend on its batch. Simplified: the token
counts for the penalties are rebuilt from the id lists every step rather than kept
incrementally on device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from serving.engine.request import SamplingParams

if TYPE_CHECKING:
    from serving.engine.sampler import SamplingState


def apply_penalties(logits: torch.Tensor, states: list[SamplingState]) -> torch.Tensor:
    """The logits plus each row's logit_bias, then after repetition, then frequency and
    presence penalties (a copy if any apply), as vLLM orders them."""
    rows = [i for i, s in enumerate(states) if _has_penalty(s.params)]
    if not rows:
        return logits
    params = [states[i].params for i in rows]
    vocab, device = logits.shape[1], logits.device
    sub = logits[rows]  # [R, V], a copy

    for r, p in enumerate(params):
        if p.logit_bias:  # a masked token's -inf stays -inf
            ids, bias = zip(*p.logit_bias, strict=True)
            sub[r, list(ids)] += torch.tensor(bias, dtype=sub.dtype, device=device)

    rep = torch.tensor([p.repetition_penalty for p in params], device=device)[:, None]
    if (rep != 1.0).any():
        seen = _counts([states[i].prompt_ids + states[i].output_ids for i in rows], vocab, device)
        penalized = torch.where(sub > 0, sub / rep, sub * rep)
        sub = torch.where(seen > 0, penalized, sub)

    freq = torch.tensor([p.frequency_penalty for p in params], device=device)[:, None]
    presence = torch.tensor([p.presence_penalty for p in params], device=device)[:, None]
    if (freq != 0.0).any() or (presence != 0.0).any():
        counts = _counts([states[i].output_ids for i in rows], vocab, device)
        sub = sub - freq * counts - presence * (counts > 0).float()

    # An extreme penalty (a tiny repetition penalty divides a logit past float range) must not
    # reach softmax as inf, which would turn a row into NaN: the largest finite value still
    # makes the token certain, as the penalty asks. A token masked out (-inf) stays out.
    big = torch.finfo(sub.dtype).max
    out = logits.clone()
    out[rows] = torch.where(torch.isneginf(logits[rows]), logits[rows], sub.clamp(-big, big))
    return out


def _has_penalty(p: SamplingParams) -> bool:
    return (p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0
            or p.presence_penalty != 0.0 or bool(p.logit_bias))  # fmt: skip


def _counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """How often each id occurs in each list: [R, vocab] float32."""
    width = max(map(len, token_lists), default=0)
    # pad with the id `vocab`, an extra column dropped after the scatter
    padded = torch.full((len(token_lists), width), vocab, dtype=torch.long)
    for r, ids in enumerate(token_lists):
        padded[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    padded = padded.to(device)
    counts = torch.zeros(len(token_lists), vocab + 1, device=device)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=counts.dtype))
    return counts[:, :vocab]


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """softmax(logits / T) without tokens under min_p times the likeliest, restricted to the
    top-k, then to the top-p nucleus: [R, V]."""
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], device=device)[:, None]
    # A temperature just above the greedy cut divides a large logit past float range: inf would
    # make softmax NaN, while the largest finite value still makes that token certain.
    big = torch.finfo(logits.dtype).max
    scaled = (logits / temperature).clamp(-big, big)
    if any(p.min_p > 0.0 for p in params):
        min_p = torch.tensor([p.min_p for p in params], device=device)[:, None]
        # p(t) < min_p * p(best)  <=>  scaled(t) < scaled(best) + log(min_p); the best stays
        floor = scaled.max(dim=-1, keepdim=True).values + min_p.log()
        scaled = scaled.masked_fill(scaled < floor, float("-inf"))
    vocab = scaled.shape[1]
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_p = torch.tensor([p.top_p for p in params], device=device)[:, None]
    if all(k == vocab for k in top_k) and bool((top_p >= 1.0).all()):
        return scaled.softmax(dim=-1)

    # stable: tied tokens keep id order, so a row's result does not depend on its batch
    ordered, order = scaled.sort(dim=-1, descending=True, stable=True)  # [R, V]
    # top-k: drop what is below the k-th largest logit; ties with it stay, as in HF
    kth = ordered.gather(1, torch.tensor(top_k, device=device)[:, None] - 1)
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    # top-p: keep a token while the mass ranked strictly above it is still short of top_p;
    # that is the smallest set reaching top_p, and always the first token
    probs = ordered.softmax(dim=-1)
    above = probs.cumsum(dim=-1) - probs
    drop = (above >= top_p) & (top_p < 1.0)  # top_p 1: no cut, whatever cumsum's rounding
    drop[:, 0] = False
    ordered = ordered.masked_fill(drop, float("-inf"))
    filtered = torch.full_like(scaled, float("-inf")).scatter(1, order, ordered)
    return filtered.softmax(dim=-1)
