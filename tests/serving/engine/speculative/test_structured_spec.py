"""Speculation keeps constrained decoding exact.

Greedy: a mixed batch of constrained rows (three schemas, json_object and tool calls, over
adapters and base-only) with free rows, staggered, gets the same tokens and finish reasons with either
proposer as without speculation, token for token, also when the KV pool is small enough to
preempt. Prompts hold JSON like the outputs', so n-gram proposals run into what the grammar
refuses and are cut there; a perfect draft under the grammar's masks is always accepted.

Sampling: speculative sampling over masked rows must keep the constrained distribution. A
tiny peaked model answers an enum schema whose values tokenize several ways; the exact
probability of every token path comes from transformers' own logits processors on the target
logits, masked by fresh xgrammar matchers, summed over every path. Pearson's chi-square at
significance 0.001 must pass with speculation and without it, and must fail when the
rejection rule is wrong (the test can tell).
"""

from collections import Counter

import pytest
import torch
import xgrammar
from transformers import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

import serving.engine.speculative.verify as verify_mod
from serving.engine.engine import Engine, EngineConfig
from serving.engine.grammar.compiler import GrammarCompiler
from serving.engine.request import GenerateRequest, SamplingParams
from serving.engine.scheduler import SchedulerConfig
from serving.engine.speculative.config import SpecConfig
from serving.model.tokenizer import load_tokenizer
from serving.model.tool_formats import HERMES
from tests.serving.engine.speculative.spec_world import runtime_model, spec_engine
from tests.serving.engine.speculative.test_distribution import chi_square_p, tiny
from tests.serving.engine.speculative.test_greedy_equality import run_staggered
from tests.serving.engine.test_engine_peft import Collector, greedy
from tests.serving.engine.test_structured import FORMATS, fmt
from tests.serving.engine.test_structured_tools import tool_format
from tests.serving.engine.world import ADAPTERS, build_world
from tests.serving.model.hf_folders import save_tokenizer

# the JSON formats, and tool calls in a family's syntax (a structural tag)
ROW_FORMATS = [f for f, _ in FORMATS] + [tool_format(HERMES, "required")]
SCHED = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_loras=8)
EXAMPLE = '{"color": "red", "size": 3} {"active": true, "age": 7, "name": "ab"}'


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("structured-spec"))


def mixed_requests(world, count=12, seed=0):
    """Constrained rows (every adapter but "qk", which only a constrained row uses) and a
    few free ones; each prompt is an example of the JSON, then a repeated motif."""
    names = ["qk", *(n for n in ADAPTERS if n != "qk"), None, None]
    example = world.tokenizer.encode(EXAMPLE, add_special_tokens=False)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        motif = torch.randint(0, 512, (int(torch.randint(2, 5, (1,), generator=gen)),), generator=gen)  # fmt: skip
        prompt = tuple(example + motif.repeat(2).tolist())
        if i % 4 == 3:  # free
            out.append(GenerateRequest(f"f{i}", prompt, greedy(16), None))
            continue
        name = names[i % len(names)]
        version = world.versions[name] if name else None
        f = ROW_FORMATS[i % len(ROW_FORMATS)]
        tool_row = f is ROW_FORMATS[-1]  # a call's own spelling takes tokens of its own
        params = SamplingParams(max_tokens=160 if tool_row else 64, temperature=0.0)
        out.append(GenerateRequest(f"c{i}", prompt, params, version, response_format=f))
    return out


@pytest.fixture(scope="module")
def plain(world):
    requests, engine = mixed_requests(world), world.engine(scheduler=SCHED)
    try:  # shut down: its compile processes end with it
        return requests, run_staggered(engine, requests)
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    ("method", "draft", "num_blocks"),
    [
        ("ngram", None, 256),
        ("draft_model", "small", 256),
        ("draft_model", "same", 256),
        ("ngram", None, 40),
        pytest.param("draft_model", "small", 40, marks=pytest.mark.slow),
    ],
    ids=["ngram", "draft", "perfect-draft", "ngram-preempt", "draft-preempt"],
)
def test_greedy_constrained_output_unchanged_by_speculation(world, plain, method, draft, num_blocks):  # fmt: skip
    requests, want = plain
    engine = spec_engine(world, method, draft=draft or "small", num_blocks=num_blocks, scheduler=SCHED)  # fmt: skip
    try:
        got = run_staggered(engine, requests)
    finally:
        engine.shutdown()
    stops = 0
    for r in requests:
        assert got.tokens[r.request_id] == want.tokens[r.request_id], r.request_id
        reason = got.done[r.request_id].finish_reason
        assert reason == want.done[r.request_id].finish_reason, r.request_id
        stops += reason == "stop"
    assert stops >= 6  # the bounded schemas' rows ended their JSON
    stats = engine.spec.stats
    qk = stats.by_adapter[stats.label(world.versions["qk"])]
    assert qk.steps > 0 and qk.accepted > 0  # a constrained row kept proposals
    if num_blocks == 40:
        assert engine.scheduler.num_preemptions > 0
    if draft == "same":  # drafting under the same masks as verification: all kept
        assert stats.by_adapter["base"].acceptance_rate == 1.0
        assert qk.acceptance_rate < 1.0  # the draft has no LoRA: the check can fail


# ---- sampling: the constrained distribution ----

ENUM = {"enum": ["a", "ab", "abc", "b", "ba", "bc", "c", "ca", "cab", "cb"]}
PARAMS = dict(temperature=1.2, top_p=0.95, repetition_penalty=1.3)
SAMPLES, FEW, ALPHA, VOCAB = 1000, 100, 1e-3, 512


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(folder, tokenizer, prompt, the exact distribution): a peaked 2-layer target and a
    1-layer draft over the engine world's tokenizer."""
    root = tmp_path_factory.mktemp("tiny-structured")
    target = tiny(0, 2, VOCAB)
    target.save_pretrained(root / "target")
    tiny(1, 1, VOCAB).save_pretrained(root / "draft")
    save_tokenizer(root / "target", "byte_level_bpe")
    tokenizer = load_tokenizer(root / "target")
    compiler = GrammarCompiler(tokenizer, VOCAB)
    grammar = compiler.compile_now(fmt(ENUM))
    compiler.shutdown()
    # the prompt quotes values, so n-gram proposals follow a quote with one of them
    prompt = tuple(tokenizer.encode('"ab" "ba" "cab"', add_special_tokens=False))
    stops = set(tokenizer.eos_token_ids)
    return root, tokenizer, prompt, exact_distribution(target, grammar, prompt, stops)


@torch.no_grad()
def exact_distribution(target, grammar, prompt, stops) -> dict[tuple[int, ...], float]:
    """P(path) of every whole output (to its stop token), under the grammar's masks and
    transformers' own logits processors, in the engine's order: mask, penalty, temperature,
    top-p."""
    procs = [RepetitionPenaltyLogitsProcessor(PARAMS["repetition_penalty"]),
             TemperatureLogitsWarper(PARAMS["temperature"]), TopPLogitsWarper(PARAMS["top_p"])]  # fmt: skip
    open_paths, done = {(): 1.0}, {}
    while open_paths:  # every open path has the same length: one batch per depth
        prefixes = list(open_paths)
        ids = torch.tensor([prompt + p for p in prefixes])
        scores = target(input_ids=ids).logits[:, -1].float()
        bitmask = xgrammar.allocate_token_bitmask(len(prefixes), VOCAB)
        for row, prefix in enumerate(prefixes):
            matcher = xgrammar.GrammarMatcher(grammar)
            assert all(matcher.accept_token(t) for t in prefix)
            matcher.fill_next_token_bitmask(bitmask, row)
        xgrammar.apply_token_bitmask_inplace(scores, bitmask)
        for proc in procs:
            scores = proc(ids, scores)
        probs = scores.softmax(-1)
        grown = {}
        for row, prefix in enumerate(prefixes):
            for t in probs[row].nonzero().flatten().tolist():
                path, p = (*prefix, t), open_paths[prefix] * float(probs[row, t])
                (done if t in stops else grown)[path] = p
        open_paths = grown
    return done


def sample_paths(
    root, tokenizer, prompt, method: str | None, count: int, seeded: bool = True
) -> list[tuple[int, ...]]:
    """count requests' tokens; seeded: request i with seed i (verified against each
    position's own draw), else unseeded (speculative sampling's rejection rule)."""
    torch.manual_seed(0)  # unseeded rows draw from torch's global generator
    spec = SpecConfig(method=method, num_speculative_tokens=3, adaptive=False, ngram_min=1,
                      ngram_max=2, max_batch_size=0) if method else SpecConfig()  # fmt: skip
    config = EngineConfig(block_size=4, num_blocks=2048, max_model_len=64, speculative=spec,
                          scheduler=SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=4096))  # fmt: skip
    draft = runtime_model(root / "draft") if method == "draft_model" else None
    engine = Engine(runtime_model(root / "target"), tokenizer, config, draft_model=draft)
    got = Collector()
    try:
        for i in range(count):
            params = SamplingParams(max_tokens=16, seed=i if seeded else None, **PARAMS)
            engine.submit(GenerateRequest(f"s{i}", prompt, params, response_format=fmt(ENUM)), got.sink)  # fmt: skip
        engine.run_until_idle()
    finally:
        engine.shutdown()
    assert {d.finish_reason for d in got.done.values()} == {"stop"}
    if method:
        assert engine.spec.stats.total.accepted > count // 4  # proposals really were kept
    return [tuple(got.tokens[f"s{i}"]) for i in range(count)]


def assert_matches(samples, exact) -> float:
    """The p-value of samples against exact; every sampled path must be one exact allows."""
    counts = Counter(samples)
    assert set(counts) <= set(exact), set(counts) - set(exact)
    return chi_square_p(counts, exact, len(samples))


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_constrained_samples_stay_in_the_grammar(models, method):
    """A quick run: every output is a path the grammar allows, and the test passes."""
    root, tokenizer, prompt, exact = models
    assert abs(sum(exact.values()) - 1) < 1e-5
    assert assert_matches(sample_paths(root, tokenizer, prompt, method, FEW), exact) > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "unseeded"])
@pytest.mark.parametrize("method", [None, "ngram", "draft_model"], ids=["plain", "ngram", "draft"])
def test_constrained_sampling_keeps_the_distribution(models, method, seeded):
    """Without speculation too: the reference is right."""
    root, tokenizer, prompt, exact = models
    p = assert_matches(sample_paths(root, tokenizer, prompt, method, SAMPLES, seeded), exact)
    assert p > ALPHA, p


@pytest.mark.slow
def test_the_test_rejects_a_wrong_acceptance_rule(models, monkeypatch):
    """Drawing from p instead of norm(max(0, p - q)) after a rejection biases the output."""
    root, tokenizer, prompt, exact = models
    monkeypatch.setattr(verify_mod, "residual", lambda p, q: p)
    samples = sample_paths(root, tokenizer, prompt, "draft_model", SAMPLES, seeded=False)
    p = assert_matches(samples, exact)
    assert p < ALPHA, p
