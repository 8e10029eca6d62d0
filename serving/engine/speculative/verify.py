"""Verification: which proposed tokens a sequence keeps, and the token the target adds.

One target forward scores k + 1 positions of a sequence: its last committed token and the
k proposals d1..dk. Row j is the target's distribution p_j for the token after d_j (row 0:
after the committed tokens). The same logits processing as without speculation applies to
each row (penalties over the tokens before it, temperature, top-k, top-p), so p_j is exactly
what plain decoding would sample from at that point.

greedy    keep d_j while d_j = argmax p_j; then add argmax p_a (a correction or the bonus).
sampling  speculative sampling (Leviathan et al. 2023; Chen et al. 2023): keep d_j with
          probability min(1, p_j(d_j) / q_j(d_j)); at the first rejection draw from
          norm(max(0, p_j - q_j)) and stop; if all k are kept, draw the bonus from p_k.
          q_j is the proposer's distribution (a point mass for n-gram and greedy drafts).
          The emitted tokens are then distributed exactly as plain sampling's.
seeded    keep d_j while d_j is the target's own draw from p_j, made with the generator
          plain decoding would use at that position (sampler.keyed); then add that draw.
          The tokens are plain sampling's own, so a seeded request's output does not
          depend on whether, or how far, it was speculated (up to rounding in the logits). A draft model draws d_j with
          the same generator, so it proposes the target's draw wherever q_j is close to p_j.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from serving.engine.grammar.masks import TokenMasks
from serving.engine.logits_processors import apply_penalties, sampling_probs
from serving.engine.request import TokenLogprob
from serving.engine.sampler import (
    DEAD_END,
    NON_FINITE,
    RowFault,
    SamplingState,
    draw,
    keyed,
    token_logprobs,
    without_dead_ends,
)


@dataclass(frozen=True)
class Verified:
    token_ids: list[int]  # the kept proposals, then the target's own token
    num_accepted: int
    logprobs: list[TokenLogprob | None]


def row_states(state: SamplingState, drafts: list[int]) -> list[SamplingState]:
    """The sampling state of each of the k + 1 rows: row j has seen d1..dj as output."""
    return [
        SamplingState(
            state.params, state.generator, state.prompt_ids, state.output_ids + drafts[:j]
        )
        for j in range(len(drafts) + 1)
    ]


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where to draw after rejecting a proposal: norm(max(0, p - q)) [V]."""
    r = (p - q).clamp(min=0.0)
    total = r.sum()
    # p == q (within rounding) leaves nothing: rejection was then a measure-zero event
    return r / total if total > 0 else p


def verify(
    logits: torch.Tensor,
    state: SamplingState,
    drafts: list[int],
    draft_probs: torch.Tensor | None,
    *,
    masks: TokenMasks | None = None,
) -> Verified:
    """Accept a prefix of drafts against the target's logits [k + 1, V] (see module doc).

    draft_probs [k, V]: the distribution each draft was drawn from; None: point masses.
    masks: row j's grammar mask after d1..dj (a constrained request): p_j is then the
    target's constrained distribution, and a draft the grammar refuses has p_j(d_j) = 0.
    RowFault: this sequence's rows cannot be verified (its caller fails this request only).
    """
    k = len(drafts)
    if logits.shape[0] != k + 1:
        raise ValueError(f"{k} drafts need {k + 1} rows of logits, got {logits.shape[0]}")
    # on the CPU, where each request's generator lives (k + 1 rows: a small copy); checked
    # there, so the check adds no wait on the device
    rows = logits.float().cpu()  # [k + 1, V]
    if not bool(torch.isfinite(rows).all()):
        raise RowFault(NON_FINITE)
    dead = [False] * (k + 1)
    if masks is not None:  # after the finiteness check: a masked logit is -inf on purpose
        rows = rows.clone()
        masks.apply(rows)
        rows, dead = without_dead_ends(rows)
    states = row_states(state, drafts)
    penalized = apply_penalties(rows, states)  # [k + 1, V]
    if state.params.greedy:
        target = penalized.argmax(dim=-1).tolist()
        a = 0
        while a < k and drafts[a] == target[a]:
            a += 1
        tokens = [*drafts[:a], target[a]]
    else:
        a, tokens = _speculative_sample(penalized, states, drafts, draft_probs)
    if any(dead[: len(tokens)]):  # now, or after an accepted draft, the grammar allows nothing
        raise RowFault(DEAD_END)
    return Verified(
        tokens, a, token_logprobs(penalized[: len(tokens)], states[: len(tokens)], tokens)
    )


def _speculative_sample(penalized, states, drafts, draft_probs):
    p = sampling_probs(penalized, [s.params for s in states])  # [k + 1, V]
    if states[0].generator is not None:  # seeded: each position's own draw (module doc)
        for j, d in enumerate(drafts):
            token = draw(p[j], keyed(states[j]))
            if token != d:
                return j, [*drafts[:j], token]
        return len(drafts), [*drafts, draw(p[len(drafts)], keyed(states[-1]))]
    for j, d in enumerate(drafts):  # unseeded: torch's global generator, as sample's rows
        q_d = float(draft_probs[j, d]) if draft_probs is not None else 1.0
        p_d = float(p[j, d])
        u = float(torch.rand(()))
        if q_d > 0 and u * q_d < p_d:  # u < p/q without dividing
            continue
        if draft_probs is not None:
            q = draft_probs[j].to(p.dtype)
        else:
            q = torch.zeros_like(p[j])
            q[d] = 1.0
        token = draw(residual(p[j], q), None)
        return j, [*drafts[:j], token]
    token = draw(p[len(drafts)], None)
    return len(drafts), [*drafts, token]
