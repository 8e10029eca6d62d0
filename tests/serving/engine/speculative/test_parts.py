"""The proposer, the k rule and the figures, on their own."""

import pytest
import torch

from serving.engine.grammar.masks import TokenMasks, allocate
from serving.engine.request import SamplingParams
from serving.engine.sampler import RowFault, SamplingState
from serving.engine.speculative.adaptive import AcceptanceTracker, best_k, expected_tokens
from serving.engine.speculative.config import SpecConfig
from serving.engine.speculative.ngram import propose_ngram
from serving.engine.speculative.stats import SpecStats
from serving.engine.speculative.verify import residual, verify


def test_ngram_proposes_what_followed_the_latest_match():
    assert propose_ngram([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], 3, 1, 3) == [7, 5, 1]
    assert propose_ngram([1, 2, 3, 4, 2], 2, 1, 3) == [3, 4]  # only a 1-gram matches
    assert propose_ngram([4, 5, 6], 2, 1, 3) == []
    assert propose_ngram([1, 2, 1, 2, 1, 2], 8, 2, 2) == [1, 2]  # the match's continuation ends
    assert propose_ngram([1, 2, 1], 0, 1, 2) == []


def test_expected_tokens_is_the_geometric_sum():
    for alpha in (0.0, 0.3, 0.8):
        for k in (1, 4):
            want = sum(alpha**i for i in range(k + 1))
            assert expected_tokens(alpha, k) == pytest.approx(want)
    assert expected_tokens(1.0, 4) == 5


def test_best_k_follows_acceptance_and_cost():
    assert best_k(0.9, 8, 0.0, 0.05) >= 6
    assert best_k(0.9, 4, 0.3, 0.05) >= 2
    assert best_k(0.05, 4, 0.5, 0.05) == 0  # a poor, costly draft: decode plainly
    tracker = AcceptanceTracker()
    for _ in range(20):
        tracker.update(4, 0)
    assert tracker.alpha < 0.01


def test_stats_bound_the_adapter_labels():
    stats = SpecStats(max_labels=2)
    stats.record("a@1", 4, 3, 4)
    stats.record(None, 4, 1, 2)
    stats.record("b@2", 4, 2, 3)
    stats.record("c@3", 4, 4, 5)
    assert set(stats.by_adapter) == {"a", "base", "other"}
    assert stats.by_adapter["other"].proposed == 8 and stats.by_adapter["other"].accepted == 6
    assert stats.total.acceptance_rate == pytest.approx(10 / 16)
    assert stats.total.tokens_per_step == pytest.approx(14 / 4)


def test_config_rejects_bad_values():
    for bad in (
        {"method": "medusa"},
        {"num_speculative_tokens": 0},
        {"ngram_min": 3, "ngram_max": 2},
    ):
        with pytest.raises(ValueError):
            SpecConfig(**bad)


def test_greedy_verification_keeps_the_matching_prefix():
    logits = torch.full((4, 6), -5.0)
    for row, best in enumerate([2, 3, 1, 4]):
        logits[row, best] = 5.0
    state = SamplingState.make(SamplingParams(temperature=0.0), [0])
    assert verify(logits, state, [2, 3, 5], None).token_ids == [2, 3, 1]  # d3 rejected, 1 added
    assert verify(logits, state, [2, 3, 1], None).token_ids == [2, 3, 1, 4]  # all kept + bonus
    assert verify(logits, state, [0, 3, 1], None).num_accepted == 0


def test_residual_removes_the_draft_mass():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.1, 0.6, 0.3])
    assert torch.allclose(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(residual(p, p), p)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_verification_fails_where_an_accepted_draft_leads_the_grammar_to_no_token(temperature):
    logits = torch.full((3, 6), -5.0)
    logits[0, 2] = logits[1, 3] = logits[2, 1] = 5.0  # the target agrees with both drafts
    state = SamplingState.make(SamplingParams(temperature=temperature, seed=0), [0])
    bitmask = allocate(3, 6)
    bitmask[1] = 0  # after d1 the grammar allows nothing
    with pytest.raises(RowFault, match="allows no next token"):
        verify(logits, state, [2, 3], None, masks=TokenMasks(bitmask, (0, 1, 2)))
    bitmask[1], bitmask[0] = -1, 0  # nothing allowed now, before any draft
    with pytest.raises(RowFault, match="allows no next token"):
        verify(logits, state, [2, 3], None, masks=TokenMasks(bitmask, (0, 1, 2)))
    bitmask[0], bitmask[2] = -1, 0  # a dead end after d2 only matters once d2 is kept
    mask_d2 = TokenMasks(bitmask.clone(), (0, 1, 2))
    logits[1, 3], logits[1, 4] = -5.0, 9.0  # the target rejects d2 (greedy, or p(d2) ~ 0)
    assert verify(logits, state, [2, 3], None, masks=mask_d2).token_ids == [2, 4]
