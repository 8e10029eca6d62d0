"""Pick the next token of every running sequence from one step's logits.

The steps follow vLLM and Hugging Face's logits processors, in their order:

    logits -> repetition penalty (prompt + output) -> frequency / presence penalties (output)
           -> [logprobs are read here] -> temperature -> top-k -> top-p -> draw

Repetition penalty is CTRL's (Keskar et al. 2019) as HF applies it: a seen token's logit is
divided by the penalty when positive, multiplied when negative. Frequency and presence
penalties are OpenAI's: logit -= frequency * count + presence * (count > 0), over generated
tokens only. Top-p is the nucleus of Holtzman et al. 2019, taken after top-k has renormalized.

Random rows draw on the CPU: unseeded ones from one default generator, a seeded one from its
own, seeded anew for every position from (seed, position) (`keyed`). A seeded draw at a
position is then the same whatever else shares its batch, and whether the token comes from
plain decoding or from speculative decoding's draft and verification (which keep a draft
only if it is that draw), up to the rounding a batch's shape can change in the logits (a
near tie), as for greedy rows. Greedy rows (temperature below 1e-5) take the argmax of the
penalized logits.

A row whose own data cannot be sampled (non-finite logits, say from its adapter, or no valid
distribution) is reported in SampleResult.errors and draws nothing; every other row's token
is computed exactly as without it, since each step here is row-wise. Simplified: the token counts for the
penalties are rebuilt from the id lists every step rather than kept incrementally on device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from serving.engine.grammar.masks import TokenMasks
from serving.engine.request import SamplingParams, TokenLogprob


@dataclass
class SamplingState:
    """One sequence's sampling inputs: its params, its generator and the tokens seen so far."""

    params: SamplingParams
    generator: torch.Generator | None  # None: draw from the sampler's default generator
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
    (seed, position); None for an unseeded row (the sampler's default generator)."""
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
    default_generator: torch.Generator | None = None,
    masks: TokenMasks | None = None,
) -> SampleResult:
    """Pick one token per row of logits [B, vocab] (float32) under each row's params.

    default_generator (a CPU generator; None: torch's global one) serves unseeded rows.
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
            gen = keyed(states[i]) if states[i].generator is not None else default_generator
            try:
                token_ids[i] = draw(probs[j], gen)
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
