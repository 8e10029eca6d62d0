"""The sampler against exact distributions and hand-computed penalties, on a small vocabulary.

Statistical checks draw many tokens with fixed seeds, so they are deterministic; the bounds
are several standard deviations wide (total variation of 20k draws over <= 6 tokens is ~0.01).
"""

import math

import pytest
import torch

from serving.engine.grammar.masks import TokenMasks, allocate
from serving.engine.logits_processors import apply_penalties
from serving.engine.request import SamplingParams
from serving.engine.sampler import DEAD_END, SamplingState, sample

DRAWS = 20_000


def _states(n: int, **params) -> list[SamplingState]:
    return [SamplingState.make(SamplingParams(**params), [0]) for _ in range(n)]


def _frequencies(logits: torch.Tensor, **params) -> torch.Tensor:
    """Empirical distribution of DRAWS draws from one row of logits, unseeded rows."""
    states = _states(DRAWS, **params)
    with torch.random.fork_rng():  # unseeded rows draw from torch's global generator
        torch.manual_seed(1234)
        result = sample(logits.expand(DRAWS, -1), states)
    counts = torch.bincount(torch.tensor(result.token_ids), minlength=logits.shape[-1])
    return counts.float() / DRAWS


def _tv(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * float((p - q).abs().sum())


def _from_probs(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs).log()


def test_greedy_is_argmax():
    logits = torch.randn(7, 50, generator=torch.Generator().manual_seed(0))
    result = sample(logits, _states(7, temperature=0.0))
    assert result.token_ids == logits.argmax(-1).tolist()
    assert result.logprobs == [None] * 7


def test_greedy_rows_in_a_mixed_batch_are_argmax():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    states = [SamplingState.make(SamplingParams(temperature=0.0 if i % 2 else 1.0), [])
              for i in range(6)]  # fmt: skip
    result = sample(logits, states)
    assert result.token_ids[1::2] == logits[1::2].argmax(-1).tolist()


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_temperature_matches_scaled_softmax(temperature):
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, 2.0])
    freq = _frequencies(logits, temperature=temperature)
    assert _tv(freq, (logits / temperature).softmax(-1)) < 0.02


def test_top_k_renormalizes_over_the_k_best():
    probs = [0.05, 0.4, 0.1, 0.3, 0.15]
    freq = _frequencies(_from_probs(probs), top_k=3)
    expected = torch.tensor([0.0, 0.4, 0.0, 0.3, 0.15]) / 0.85
    assert _tv(freq, expected) < 0.02
    assert freq[0] == 0 and freq[2] == 0


@pytest.mark.parametrize(
    "top_p, nucleus",
    [(0.7, [0, 1]), (0.8, [0, 1, 2]), (0.95, [0, 1, 2, 3]), (0.01, [0]), (1.0, [0, 1, 2, 3, 4])],
)
def test_top_p_keeps_the_smallest_nucleus(top_p, nucleus):
    probs = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03])
    # shuffle the ids, so the nucleus is not simply a prefix of the vocabulary
    perm = torch.tensor([3, 0, 4, 1, 2])
    logits = torch.empty(5)
    logits[perm] = probs.log()
    freq = _frequencies(logits, top_p=top_p)
    expected = torch.zeros(5)
    expected[perm[nucleus]] = probs[nucleus] / probs[nucleus].sum()
    assert set(freq.nonzero().flatten().tolist()) == set(perm[nucleus].tolist())
    assert _tv(freq, expected) < 0.02


def test_top_p_applies_after_top_k_renormalized():
    # top-k 2 leaves [4/7, 3/7]: 4/7 >= 0.5 alone; without renormalizing 0.4 < 0.5 would not be
    freq = _frequencies(_from_probs([0.4, 0.3, 0.2, 0.1]), top_k=2, top_p=0.5)
    assert freq.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_temperature_top_k_top_p_together():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    scaled = (logits / 0.5).softmax(-1)  # [0.83, 0.11, 0.04, 0.02, 0.00]
    freq = _frequencies(logits, temperature=0.5, top_k=3, top_p=0.9)
    kept = scaled[:2] / scaled[:2].sum()  # top-3 renormalized, then 0.83 + 0.11 reaches 0.9
    assert _tv(freq, torch.cat([kept, torch.zeros(3)])) < 0.02


def _run(states: list[SamplingState], steps: int, vocab: int = 32) -> list[list[int]]:
    """Sample `steps` tokens for every state from per-step random logits; tokens per row."""
    logit_gen = torch.Generator().manual_seed(99)
    with torch.random.fork_rng():  # unseeded rows draw from torch's global generator
        torch.manual_seed(7)
        for _ in range(steps):
            base = torch.randn(vocab, generator=logit_gen)
            result = sample(base.expand(len(states), -1).clone(), states)
            for s, t in zip(states, result.token_ids):
                s.output_ids.append(t)
    return [s.output_ids for s in states]


def test_seeded_row_is_reproducible_alone_and_in_any_batch():
    seeded = dict(seed=42, temperature=0.9, top_k=20, top_p=0.95, repetition_penalty=1.3)
    alone = _run([SamplingState.make(SamplingParams(**seeded), [1, 2])], steps=40)[0]
    assert alone == _run([SamplingState.make(SamplingParams(**seeded), [1, 2])], steps=40)[0]

    others = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0),  # unseeded: the shared default generator
        SamplingParams(seed=7, temperature=1.5),
        SamplingParams(temperature=0.0, frequency_penalty=1.0),
        SamplingParams(temperature=1.0, top_p=0.5, presence_penalty=0.5),
    ]
    for position in (0, 3, 5):
        params = [*others[:position], SamplingParams(**seeded), *others[position:]]
        rows = _run([SamplingState.make(p, [1, 2]) for p in params], steps=40)
        assert rows[position] == alone, position


def test_different_seeds_differ():
    a = _run([SamplingState.make(SamplingParams(seed=1), [])], steps=30)[0]
    b = _run([SamplingState.make(SamplingParams(seed=2), [])], steps=30)[0]
    assert a != b


PENALTY_LOGITS = [2.0, -1.0, 0.5, 3.0, -2.0, 0.0]


def _penalty_state(**params) -> SamplingState:
    state = SamplingState.make(SamplingParams(temperature=0.0, **params), [0, 1])
    state.output_ids += [3, 3, 4]
    return state


@pytest.mark.parametrize(
    "params, expected",
    [
        # repetition over prompt + output {0, 1, 3, 4}: positive / 2, negative * 2
        (dict(repetition_penalty=2.0), [1.0, -2.0, 0.5, 1.5, -4.0, 0.0]),
        # frequency over output only: token 3 twice, token 4 once; prompt tokens untouched
        (dict(frequency_penalty=0.5), [2.0, -1.0, 0.5, 2.0, -2.5, 0.0]),
        (dict(presence_penalty=0.25), [2.0, -1.0, 0.5, 2.75, -2.25, 0.0]),
        # all three: repetition first, then 3: 1.5 - 2*0.5 - 0.25, 4: -4 - 0.5 - 0.25
        (
            dict(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
            [1.0, -2.0, 0.5, 0.25, -4.75, 0.0],
        ),
    ],
)
def test_penalties_match_hand_computed_logits(params, expected):
    plain = SamplingState.make(SamplingParams(), [0, 1, 3])
    logits = torch.tensor([PENALTY_LOGITS, PENALTY_LOGITS])
    out = apply_penalties(logits, [_penalty_state(**params), plain])
    assert out[0].tolist() == pytest.approx(expected)
    assert out[1].tolist() == PENALTY_LOGITS  # a row without penalties is untouched
    assert logits[0].tolist() == PENALTY_LOGITS  # and the input is not modified


def test_greedy_and_logprobs_see_the_penalized_logits():
    params = dict(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    state = _penalty_state(logprobs=6, **params)
    result = sample(torch.tensor([PENALTY_LOGITS]), [state])
    assert result.token_ids == [0]  # token 3 led before the penalties
    expected = torch.log_softmax(torch.tensor([1.0, -2.0, 0.5, 0.25, -4.75, 0.0]), -1)
    top = dict(result.logprobs[0].top)
    assert [top[i] for i in range(6)] == pytest.approx(expected.tolist(), abs=1e-6)


def test_logprobs_match_log_softmax_before_temperature():
    logits = torch.randn(4, 40, generator=torch.Generator().manual_seed(3))
    states = [
        SamplingState.make(SamplingParams(temperature=0.0, logprobs=5), []),
        SamplingState.make(SamplingParams(temperature=0.5, top_k=3, logprobs=2, seed=0), []),
        SamplingState.make(SamplingParams(temperature=1.0, seed=1), []),
        SamplingState.make(SamplingParams(temperature=2.0, top_p=0.3, logprobs=0, seed=2), []),
    ]
    result = sample(logits, states)
    reference = torch.log_softmax(logits, -1)
    assert result.logprobs[2] is None
    for row, n in ((0, 5), (1, 2), (3, 0)):
        lp = result.logprobs[row]
        token = result.token_ids[row]
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(float(reference[row, token]), abs=1e-6)
        ids = reference[row].argsort(descending=True)[:n].tolist()
        assert [i for i, _ in lp.top] == ids  # best first
        assert [v for _, v in lp.top] == pytest.approx(reference[row, ids].tolist(), abs=1e-6)
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True)
        assert all(math.isfinite(v) for v in values)


def test_rows_must_match_states():
    with pytest.raises(ValueError):
        sample(torch.zeros(2, 5), _states(3))


def test_an_extreme_penalty_gives_a_certain_token_not_nan():
    """A repetition penalty of 5e-324 divides a positive logit past float range."""
    logits = torch.tensor([[1.0, 2.0, 0.5]])
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, repetition_penalty=5e-324, seed=1)
        state = SamplingState.make(params, [0])  # token 0 was seen: its logit 1.0 explodes
        assert sample(logits, [state]).token_ids == [0]


def _masks(allowed_per_row: list[list[int] | None], vocab: int) -> TokenMasks:
    """Masks allowing only the given ids in each row (None: the row is free)."""
    bitmask = allocate(len(allowed_per_row), vocab)  # [R, W] int32, every bit set
    for r, allowed in enumerate(allowed_per_row):
        if allowed is not None:
            bits = torch.zeros(bitmask.shape[1] * 32, dtype=torch.int64)
            bits[allowed] = 1
            words = (bits.view(-1, 32) << torch.arange(32)).sum(-1)  # [W], bit t of word t//32
            bitmask[r] = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    rows = tuple(r for r, allowed in enumerate(allowed_per_row) if allowed is not None)
    return TokenMasks(bitmask, rows)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_row_whose_grammar_allows_nothing_fails_alone(temperature):
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(5))
    states = _states(3, temperature=temperature, seed=3)
    result = sample(logits, states, masks=_masks([[], [7, 9], None], 40))
    assert result.errors == [DEAD_END, None, None]
    assert result.token_ids[1] in (7, 9)
    alone = sample(logits[2:], _states(1, temperature=temperature, seed=3))
    assert result.token_ids[2] == alone.token_ids[0]  # the free row is as without the others


def test_penalties_keep_tokens_the_grammar_masks_out_of_the_logprobs():
    logits = torch.tensor([PENALTY_LOGITS])
    params = dict(repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.25)
    result = sample(logits, [_penalty_state(logprobs=6, **params)], masks=_masks([[2, 5]], 6))
    assert sorted(t for t, _ in result.logprobs[0].top) == [2, 5]
    assert result.token_ids[0] in (2, 5) and result.errors == [None]
    penalized = apply_penalties(logits, [_penalty_state(**params)])[0, [2, 5]]
    expected = torch.log_softmax(penalized, -1).tolist()  # renormalized over what is allowed
    assert [dict(result.logprobs[0].top)[t] for t in (2, 5)] == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(("temperature", "min_p"), [(1.0, 0.2), (2.0, 0.5), (0.7, 0.05)])
def test_min_p_drops_what_is_under_its_share_of_the_likeliest(temperature, min_p):
    logits = torch.tensor([1.5, 0.2, -0.4, 1.0, -2.0, 0.9], dtype=torch.float64)
    p = (logits / temperature).softmax(-1)  # float64 oracle: keep p >= min_p * max p
    kept = torch.where(p >= min_p * p.max(), p, torch.zeros_like(p))
    freq = _frequencies(logits.float(), temperature=temperature, min_p=min_p)
    assert set(freq.nonzero().flatten().tolist()) == set(kept.nonzero().flatten().tolist())
    assert _tv(freq.double(), kept / kept.sum()) < 0.02


def test_logit_bias_is_added_before_the_penalties():
    bias = {1: 3.0, 4: -1.0, 5: 0.5}
    params = dict(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    state = _penalty_state(logit_bias=tuple(bias.items()), **params)
    out = apply_penalties(torch.tensor([PENALTY_LOGITS]), [state])[0]
    counts = {t: (state.prompt_ids + state.output_ids).count(t) for t in range(6)}
    output = {t: state.output_ids.count(t) for t in range(6)}
    expected = []
    for t, logit in enumerate(PENALTY_LOGITS):  # float64 by hand
        x = logit + bias.get(t, 0.0)
        if counts[t]:
            x = x / 2.0 if x > 0 else x * 2.0
        expected.append(x - 0.5 * output[t] - 0.25 * (output[t] > 0))
    assert out.tolist() == pytest.approx(expected, abs=1e-6)


def test_non_finite_rows_fail_alone_and_huge_finite_rows_do_not():
    """Rows with a NaN, +inf or -inf logit fail their request; a row of finite logits whose
    sum overflows to inf (or to -inf) samples as usual, and so do the clean rows."""
    huge = torch.full((8,), 3e38)
    huge[5] = 3.3e38  # its argmax
    rows = [torch.zeros(8), huge, -huge, torch.zeros(8), torch.zeros(8), torch.zeros(8)]
    rows[0][2] = 1.0
    rows[3][1], rows[4][6], rows[5][0] = math.nan, math.inf, -math.inf
    logits = torch.stack(rows)
    assert not torch.isfinite(logits[1:3].sum(dim=-1)).any()  # the sums overflow
    result = sample(logits, _states(6, temperature=0.0))
    assert result.errors[:3] == [None, None, None]
    assert result.token_ids[:3] == [2, 5, int(torch.argmax(-huge))]
    assert all("non-finite" in e for e in result.errors[3:])
