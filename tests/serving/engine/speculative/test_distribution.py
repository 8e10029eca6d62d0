"""Speculative sampling keeps the target's distribution exactly.

A tiny 8-token model samples 4 tokens per request, thousands of seeded requests, with
penalties, temperature and top-p. The exact distribution comes from transformers: the model's
probabilities under its own logits processors, summed over every path. A chi-square test at
significance 0.001 must pass with speculation, and must fail when the rejection rule is wrong.
"""

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

import serving.engine.speculative.verify as verify_mod
from serving.engine.engine import Engine, EngineConfig
from serving.engine.request import GenerateRequest, SamplingParams
from serving.engine.scheduler import SchedulerConfig
from serving.engine.speculative.config import SpecConfig
from serving.model.tokenizer import load_tokenizer
from tests.serving.engine.speculative.spec_world import runtime_model
from tests.serving.engine.test_engine_peft import Collector
from tests.serving.model.hf_folders import save_tokenizer

VOCAB, NEW, SAMPLES, ALPHA = 8, 4, 3000, 1e-3
PROMPT = (1, 2, 3, 1)
BIAS = ((3, 1.5), (6, -2.0))  # logit_bias: added first, as vLLM adds it
PARAMS = dict(temperature=0.9, top_p=0.95, repetition_penalty=1.3, min_p=0.02, logit_bias=BIAS)


def tiny(seed: int, layers: int, vocab: int = VOCAB) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    # a wide init makes the distributions peaked, so a wrong rule shows
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3,
                      max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    target, draft = tiny(0, 2), tiny(1, 1)
    target.save_pretrained(root / "target")
    draft.save_pretrained(root / "draft")
    save_tokenizer(root / "target", "byte_level_bpe")
    return root, target


@torch.no_grad()
def exact_distribution(target) -> dict[tuple[int, ...], float]:
    """P(t1..t4) of every path, under transformers' own logits processors."""
    procs = [SequenceBiasLogitsProcessor([[[t], b] for t, b in BIAS]),
             RepetitionPenaltyLogitsProcessor(PARAMS["repetition_penalty"]),
             TemperatureLogitsWarper(PARAMS["temperature"]), MinPLogitsWarper(PARAMS["min_p"]),
             TopPLogitsWarper(PARAMS["top_p"])]  # fmt: skip
    paths = {(): 1.0}
    for _ in range(NEW):
        prefixes = list(paths)
        ids = torch.tensor([PROMPT + p for p in prefixes])
        scores = target(input_ids=ids).logits[:, -1].float()
        for proc in procs:
            scores = proc(ids, scores)
        probs = scores.softmax(-1)
        paths = {
            (*p, t): paths[p] * float(probs[i, t])
            for i, p in enumerate(prefixes)
            for t in range(VOCAB)
        }
    return paths


def sample_paths(root, method: str, count: int, seeded: bool = True) -> list[tuple[int, ...]]:
    """count requests' tokens; seeded: request i with seed i (verified against each
    position's own draw), else unseeded (speculative sampling's rejection rule)."""
    torch.manual_seed(0)  # unseeded rows draw from torch's global generator
    spec = SpecConfig(
        method=method,
        num_speculative_tokens=3,
        adaptive=False,
        ngram_min=1,
        ngram_max=2,
        max_batch_size=0,
    )
    config = EngineConfig(block_size=4, num_blocks=2048, max_model_len=64, speculative=spec,
                          scheduler=SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=4096))  # fmt: skip
    draft = runtime_model(root / "draft") if method == "draft_model" else None
    engine = Engine(
        runtime_model(root / "target"), load_tokenizer(root / "target"), config, draft_model=draft
    )
    got = Collector()
    for i in range(count):
        params = SamplingParams(max_tokens=NEW, seed=i if seeded else None, ignore_eos=True,
                                **PARAMS)  # fmt: skip
        engine.submit(GenerateRequest(f"s{i}", PROMPT, params), got.sink)
    engine.run_until_idle()
    assert engine.spec.stats.total.steps > count // 2  # most requests were verified
    return [tuple(got.tokens[f"s{i}"]) for i in range(count)]


def chi_square_p(observed: dict, expected: dict, n: int) -> float:
    """p-value of Pearson's chi-square; cells expecting fewer than 5 are pooled."""
    small = [c for c, p in expected.items() if p * n < 5]
    cells = [[c] for c, p in expected.items() if p * n >= 5] + ([small] if small else [])
    stat = 0.0
    for group in cells:
        e = sum(expected[c] for c in group) * n
        o = sum(observed.get(c, 0) for c in group)
        stat += (o - e) ** 2 / e
    dof = len(cells) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))


def marginals(paths: dict, positions: tuple[int, ...]) -> dict:
    out: dict = {}
    for p, prob in paths.items():
        key = tuple(p[i] for i in positions)
        out[key] = out.get(key, 0.0) + prob
    return out


def p_values(samples, exact) -> list[float]:
    """The speculated tokens (2nd to 4th): joint of 2nd and 3rd, and the 4th alone."""
    out = []
    for positions in ((1, 2), (3,)):
        observed: dict = {}
        for s in samples:
            key = tuple(s[i] for i in positions)
            observed[key] = observed.get(key, 0) + 1
        out.append(chi_square_p(observed, marginals(exact, positions), len(samples)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "unseeded"])
@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_speculative_sampling_matches_the_target_distribution(models, method, seeded):
    root, target = models
    exact = exact_distribution(target)
    assert abs(sum(exact.values()) - 1) < 1e-5
    ps = p_values(sample_paths(root, method, SAMPLES, seeded), exact)
    assert min(ps) > ALPHA / 2, ps  # Bonferroni over the two tests


@pytest.mark.slow
def test_the_test_rejects_a_wrong_acceptance_rule(models, monkeypatch):
    """Drawing from p instead of norm(max(0, p - q)) after a rejection biases the output."""
    root, target = models
    monkeypatch.setattr(verify_mod, "residual", lambda p, q: p)
    samples = sample_paths(root, "draft_model", SAMPLES, seeded=False)
    ps = p_values(samples, exact_distribution(target))
    assert min(ps) < ALPHA / 2, ps


def test_plain_sampling_passes_the_same_test(models):
    """Without speculation the same engine and test agree: the reference is right."""
    root, target = models
    config = EngineConfig(block_size=4, num_blocks=2048, max_model_len=64,
                          scheduler=SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=4096))  # fmt: skip
    engine = Engine(runtime_model(root / "target"), load_tokenizer(root / "target"), config)
    got = Collector()
    for i in range(SAMPLES):
        engine.submit(
            GenerateRequest(
                f"s{i}", PROMPT, SamplingParams(max_tokens=NEW, seed=i, ignore_eos=True, **PARAMS)
            ),
            got.sink,
        )
    engine.run_until_idle()
    samples = [tuple(got.tokens[f"s{i}"]) for i in range(SAMPLES)]
    assert min(p_values(samples, exact_distribution(target))) > ALPHA / 2
