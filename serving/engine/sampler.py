"""Pick the next token of every running sequence from one step's logits.

The steps follow vLLM and Hugging Face's logits processors (serving/engine/logits_processors.py),
in their order:

    logits -> [grammar mask] -> logit bias, repetition, frequency / presence penalties
           -> [logprobs are read here] -> temperature -> min-p -> top-k -> top-p -> draw

Random rows draw on the CPU: unseeded ones from torch's global generator, a seeded one from its
own, seeded anew for every position from (seed, position) (`keyed`). A seeded draw at a
position is then the same whatever else shares its batch, and whether the token comes from
plain decoding or from speculative decoding's draft and verification (which keep a draft
only if it is that draw), up to the rounding a batch's shape can change in the logits (a
near tie), as for greedy rows. Greedy rows (temperature below 1e-5) take the argmax of the
penalized logits.

A row whose own data cannot be sampled (non-finite logits, say from its adapter, or no valid
distribution) is reported in SampleResult.errors and draws nothing; every other row's token
is computed exactly as without it, since each step here is row-wise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from serving.engine.grammar.masks import TokenMasks
from serving.engine.logits_processors import apply_penalties, sampling_probs
from serving.engine.request import SamplingParams, TokenLogprob


@dataclass
class SamplingState:
    """One sequence's sampling inputs: its params, its generator and the tokens seen so far."""

    params: SamplingParams
    generator: torch.Generator | None  # None: draw from torch's global generator
    prompt_ids: list[int]
    output_ids: list[int]  # the engine appends each sampled token

    @staticmethod
    def make(params: SamplingParams, prompt_ids: list[int]) -> SamplingState:
        """A fresh state; a CPU generator seeded from params.seed when one is given."""
        generator = None if params.seed is None else torch.Generator().manual_seed(params.seed)
        return SamplingState(params, generator, list(prompt_ids), [])


_MASK64 = (1 << 64) - 1


def keyed(state: SamplingState) -> torch.Generator | None:
    """The generator for the token after state's output: a seeded row's own, seeded from
    (seed, position); None for an unseeded row (torch's global generator)."""
    if state.generator is None:
        return None
    # splitmix64 of (seed, position): nearby seeds (n choices: seed + j) share no stream
    z = (state.params.seed * 0x9E3779B97F4A7C15 + len(state.output_ids) + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state.generator.manual_seed((z ^ (z >> 31)) >> 1)


class RowFault(ValueError):
    """One request's own data made its row unsampleable; the message is meant for its caller."""


NON_FINITE = (
    "the model produced non-finite logits for this request (NaN or inf); its adapter may be broken"
)
DEAD_END = (
    "the response format allows no next token here: no output can satisfy its schema or pattern"
)


@dataclass(frozen=True)
class SampleResult:
    token_ids: list[int]  # one per row (0 for a failed row)
    logprobs: list[TokenLogprob | None]  # None for rows whose params.logprobs is None
    errors: list[str | None]  # why a row could not be sampled; None for every row that was


def sample(
    logits: torch.Tensor,
    states: list[SamplingState],
    *,
    masks: TokenMasks | None = None,
) -> SampleResult:
    """Pick one token per row of logits [B, vocab] (float32) under each row's params.

    masks: the tokens constrained rows may pick (their grammars'); every other row is as
    without it. Applied before every other processor, so a row's distribution is its
    unconstrained one renormalized over what its grammar allows.
    """
    if logits.dim() != 2 or logits.shape[0] != len(states):
        raise ValueError(f"logits {tuple(logits.shape)} do not match {len(states)} states")
    errors: list[str | None] = [None] * len(states)
    # float32 throughout (a no-op when it already is): bf16 logprobs and cumsums are coarse
    logits = logits.float()
    finite = finite_rows(logits)
    if not all(finite):
        # A bad row is zeroed, so nothing downstream raises on it; the others are untouched.
        logits = logits.masked_fill(~torch.tensor(finite, device=logits.device)[:, None], 0.0)
        errors = [None if ok else NON_FINITE for ok in finite]
    if masks is not None:  # after the finiteness check: a masked logit is -inf on purpose
        logits = logits.clone()
        masks.apply(logits)
        logits, dead = without_dead_ends(logits)
        errors = [DEAD_END if d else e for d, e in zip(dead, errors, strict=True)]
    logits = apply_penalties(logits, states)
    token_ids = [0] * len(states)

    greedy = [i for i, s in enumerate(states) if s.params.greedy]
    if len(greedy) == len(states):  # the common case: one argmax, no copy
        token_ids = logits.argmax(dim=-1).tolist()
    elif greedy:
        for i, t in zip(greedy, logits[greedy].argmax(dim=-1).tolist()):
            token_ids[i] = t

    rows = [i for i, s in enumerate(states) if not s.params.greedy]
    if rows:
        probs = sampling_probs(logits[rows], [states[i].params for i in rows]).cpu()
        for j, i in enumerate(rows):
            if errors[i] is not None:
                continue
            try:
                token_ids[i] = draw(probs[j], keyed(states[i]))
            except RowFault as exc:
                errors[i] = str(exc)

    return SampleResult(token_ids, token_logprobs(logits, states, token_ids), errors)


def finite_rows(logits: torch.Tensor) -> list[bool]:
    """Whether each row of logits [B, V] is all finite. A row's sum is finite when its
    logits are, unless finite ones overflow it: only the rows whose sum is not are read
    whole again (one pass over the logits, not isfinite's three and a reduction)."""
    finite = torch.isfinite(logits.sum(dim=-1)).tolist()
    if all(finite):
        return finite
    suspect = [i for i, ok in enumerate(finite) if not ok]
    again = torch.isfinite(logits[suspect]).all(dim=-1).tolist()
    for i, ok in zip(suspect, again, strict=True):
        finite[i] = ok
    return finite


def without_dead_ends(masked: torch.Tensor) -> tuple[torch.Tensor, list[bool]]:
    """(masked logits [R, V] with rows whose grammar allows no token zeroed, which rows).

    Such a row fails its request (DEAD_END); zeroed, it keeps softmax and argmax from NaN.
    """
    dead = torch.isneginf(masked).all(dim=-1)  # [R]
    flags = dead.tolist()
    return (masked.masked_fill(dead[:, None], 0.0) if any(flags) else masked), flags


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id drawn from probs [V]; RowFault when probs is no distribution."""
    total = float(probs.sum())
    if not (math.isfinite(total) and total > 0 and bool((probs >= 0).all())):
        raise RowFault(
            "sampling failed: the request's sampling parameters leave no valid distribution"
        )
    return int(torch.multinomial(probs, 1, generator=generator))


def token_logprobs(
    logits: torch.Tensor, states: list[SamplingState], token_ids: list[int]
) -> list[TokenLogprob | None]:
    """The sampled token's and the top-n log-probabilities under the penalized logits."""
    out: list[TokenLogprob | None] = [None] * len(states)
    rows = [i for i, s in enumerate(states) if s.params.logprobs is not None]
    if not rows:
        return out
    # before temperature and truncation: the model's own distribution, as vLLM reports it
    lp = torch.log_softmax(logits[rows], dim=-1)  # [R, V]
    chosen = torch.tensor([token_ids[i] for i in rows], device=lp.device)[:, None]
    chosen_lp = lp.gather(1, chosen)[:, 0].tolist()
    n_max = min(max(states[i].params.logprobs or 0 for i in rows), lp.shape[1])
    top_lp, top_ids = lp.topk(n_max, dim=-1) if n_max else (lp[:, :0], lp[:, :0].long())
    top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
    for j, i in enumerate(rows):
        n = states[i].params.logprobs or 0
        # a token its grammar masks out (-inf) is no alternative: it could not have come
        top = tuple((t, v) for t, v in zip(top_ids[j][:n], top_lp[j][:n]) if v != -math.inf)
        out[i] = TokenLogprob(token_ids[i], chosen_lp[j], top)
    return out
