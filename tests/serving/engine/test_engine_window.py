"""The engine under a sliding window: a tiny Mistral whose every layer attends through 8 keys,
block_size 4. Its sequences release the KV blocks behind the window as they go, so they run
in KV pools too small for their lengths, with transformers' greedy tokens: alone, through
preemption and recompute, on prefix hits, and under speculation (whose drafts roll back)."""

import pytest

from serving.engine.request import GenerateRequest
from serving.engine.scheduler import SchedulerConfig
from tests.serving.engine.speculative.spec_world import spec_engine
from tests.serving.engine.speculative.test_greedy_equality import run_staggered
from tests.serving.engine.test_engine_peft import Collector, greedy
from tests.serving.engine.world import build_world

WINDOW, BLOCK = 8, 4


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("window-mistral"), "mistral")


def prompt(seed: int, length: int) -> tuple[int, ...]:
    return tuple((seed * 37 + i * 11) % 500 + 3 for i in range(length))


def run_watching(engine, requests, max_steps=400):
    """Step until done (or max_steps); the outputs and the most blocks held at once."""
    got, peak = Collector(), 0
    for r in requests:
        engine.submit(r, got.sink)
    for _ in range(max_steps):
        if not engine.step():
            break
        peak = max(peak, engine.blocks.num_blocks - engine.blocks.num_free_blocks)
    return got, peak


def test_a_sequence_longer_than_the_pool_runs_with_transformers_tokens(world, engines):
    # 20 + 40 tokens need 15 blocks; the pool has 6. The prompt takes 5 at once, then a
    # decode holds the window's 2-3 blocks and the one its next token goes to.
    engine = engines(num_blocks=6)
    assert engine.blocks.window.window == WINDOW
    request = GenerateRequest("long", prompt(1, 20), greedy(40), world.versions["rot13"])
    got, peak = run_watching(engine, [request])
    assert got.done["long"].finish_reason == "length"
    assert got.tokens["long"] == world.reference(list(request.prompt_token_ids), "rot13", 40)
    assert peak <= 5 < -(-60 // BLOCK)
    assert engine.blocks.num_free_blocks == 6 and engine.scheduler.num_preemptions == 0


def test_a_long_prompt_runs_in_chunks_the_free_blocks_hold(world, engines):
    """A 40-token prompt in a pool of 5 blocks (20 tokens): each chunk is cut to what is
    free, and the blocks behind it are released before the next."""
    engine = engines(num_blocks=5)
    request = GenerateRequest("chunked", prompt(2, 40), greedy(12))
    got, peak = run_watching(engine, [request])
    assert got.tokens["chunked"] == world.reference(list(request.prompt_token_ids), None, 12)
    assert peak <= 5


def test_preemption_and_recompute_keep_transformers_tokens(world, engines):
    """Four sequences of 44-50 tokens in 8 blocks: they preempt each other, and each
    recomputes from a full table what it had released."""
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32)
    engine = engines(num_blocks=8, scheduler=sched)
    names = ["upper", None, "mlp", None]
    requests = [
        GenerateRequest(f"p{i}", prompt(10 + i, 14 + 2 * i), greedy(30),
                        world.versions[name] if name else None)
        for i, name in enumerate(names)
    ]  # fmt: skip
    got, _ = run_watching(engine, requests, max_steps=1000)
    assert engine.scheduler.num_preemptions > 0
    for r, name in zip(requests, names):
        assert got.tokens[r.request_id] == world.reference(list(r.prompt_token_ids), name, 30)
    assert engine.blocks.num_free_blocks == 8


def test_a_prefix_released_by_one_sequence_answers_another(world, engines):
    """a releases its prompt's first blocks as it decodes; b, the same prompt, finds them
    (those behind its first query's window named RELEASED, taken from no one)."""
    engine = engines(num_blocks=8)
    v, text = world.versions["qk"], prompt(3, 23)
    first, peak_a = run_watching(engine, [GenerateRequest("a", text, greedy(8), v)])
    second, peak_b = run_watching(engine, [GenerateRequest("b", text, greedy(8), v)])
    assert second.done["b"].cached_tokens == 20 and first.done["a"].cached_tokens == 0
    assert second.tokens["b"] == first.tokens["a"] == world.reference(list(text), "qk", 8)
    assert peak_a <= 6 < -(-31 // BLOCK)  # its prompt's 6 blocks, never its length's 8
    assert peak_b <= 4  # 2 hits in its window, the prompt's last block and one to decode


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculation_under_a_window_is_lossless(world, method):
    """Drafts (n-gram, or the model itself as its own draft, whose KV follows the same
    tables) over motifs the n-gram finds, in 16 blocks: rejected drafts roll back above
    the released blocks, and the blocks the draft's catch-up reads are kept for it, so its
    KV stays exact (the model as its own draft has every proposal accepted)."""
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32)
    requests = [  # the last one's prompt inside the window: nothing released at first
        GenerateRequest(f"s{i}", (prompt(20 + i, 3 + i) * 5)[: 24 if i < 3 else 6], greedy(24))
        for i in range(4)
    ]  # fmt: skip
    engine = spec_engine(world, method, draft="same", k=3, num_blocks=16, scheduler=sched)
    try:
        assert engine.blocks.window.window == WINDOW
        got = run_staggered(engine, requests)
    finally:
        engine.shutdown()
    stats = engine.spec.stats
    assert stats.total.steps > 0
    if method == "draft_model":
        assert stats.by_adapter["base"].acceptance_rate == 1.0
    for r in requests:
        assert got.tokens[r.request_id] == world.reference(list(r.prompt_token_ids), None, 24)
