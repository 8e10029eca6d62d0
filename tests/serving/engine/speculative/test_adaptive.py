"""Adaptive k inside the decoder: k follows a sequence's acceptance, a sequence at k = 0 probes
now and then, and a prompt lookup with no match reserves no KV."""

from serving.engine.kv_cache import BlockManager
from serving.engine.request import GenerateRequest, SamplingParams
from serving.engine.sampler import SamplingState
from serving.engine.scheduler import Scheduled
from serving.engine.sequence import Sequence
from serving.engine.speculative.config import SpecConfig
from serving.engine.speculative.decoder import PROBE_EVERY, SpecDecoder

REPEATING = [1, 2, 3, 4, 5, 6] * 4


def decoding(tokens: list[int]):
    """A decoder (n-gram, adaptive) and a sequence decoding its last token."""
    blocks = BlockManager(64, 4)
    decoder = SpecDecoder(
        SpecConfig(method="ngram", num_speculative_tokens=4, max_batch_size=0), blocks, None
    )
    request = GenerateRequest("a", tuple(tokens[:-1]), SamplingParams(temperature=0.0))
    seq = Sequence(request=request, token_ids=list(tokens), adapter_key=None)
    blocks.allocate(seq, len(tokens))
    blocks.mark_computed(seq, len(tokens) - 1)  # one uncomputed token: it is decoding
    state = SamplingState.make(request.sampling, list(request.prompt_token_ids))
    return decoder, seq, lambda s: (state, 100)


def plan(decoder, seq, lookup):
    return decoder.plan([Scheduled(seq, 1)], 1, lambda s: (*lookup(s), None), budget=100).get(
        seq.seq_id
    )


def test_k_grows_with_acceptance_and_stops_after_rejections():
    decoder, seq, lookup = decoding(REPEATING)
    first = plan(decoder, seq, lookup)
    assert len(first.tokens) == 2  # the prior acceptance: a cautious k
    for _ in range(10):
        decoder.after_verify(seq, first, num_accepted=2, emitted=3)
    assert len(plan(decoder, seq, lookup).tokens) == 4  # everything kept: the largest k
    for _ in range(20):
        decoder.after_verify(seq, first, num_accepted=0, emitted=1)
    misses = [plan(decoder, seq, lookup) for _ in range(PROBE_EVERY - 1)]
    assert misses == [None] * (PROBE_EVERY - 1)  # nothing kept: plain decoding
    probe = plan(decoder, seq, lookup)
    assert probe is not None and len(probe.tokens) == 1  # then one token, to notice a change


def test_no_match_reserves_no_blocks():
    decoder, seq, lookup = decoding(list(range(10, 34)))
    held = list(seq.block_table)
    assert plan(decoder, seq, lookup) is None
    assert seq.block_table == held
