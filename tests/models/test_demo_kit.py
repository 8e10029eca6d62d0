"""The committed demo kit: it loads like any checkpoint, and each adapter visibly does its job."""

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from serving.config import load_config
from serving.engine.request import GenerateRequest, SamplingParams
from serving.model.loader import load_model
from tests.models.kit import ADAPTERS, DEMO, corpus, demo_engine, transforms
from tests.serving.engine.test_engine_peft import Collector

RAW = ["def fibonacci(n):\n", "class Stack:\n", "def read_config(path):\n", "import os\n\n"]
CHAT = ["Return the number of items in the queue.", "Split a path into its directory and name."]


def test_kit_fits_in_40_mb():
    files = [p for p in DEMO.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert sum(p.stat().st_size for p in files) <= 40 * 2**20


def test_kit_loads_and_matches_transformers():
    """Our loader reads the kit as any Hugging Face folder; logits and tokens agree with transformers."""
    loaded = load_model(DEMO / "base", quantization="none")
    hf_tok = AutoTokenizer.from_pretrained(DEMO / "base")
    messages = [{"role": "user", "content": CHAT[0]}]
    assert loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True) == (
        hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    )
    text = RAW[0] + '    """Return the n-th Fibonacci number."""\n'
    assert loaded.tokenizer.encode(text) == hf_tok(text)["input_ids"]
    engine, _ = demo_engine()
    prompt = tuple(loaded.tokenizer.encode(text))
    got = Collector()
    engine.submit(
        GenerateRequest(
            "a", prompt, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        ),
        got.sink,
    )
    engine.run_until_idle()
    hf = AutoModelForCausalLM.from_pretrained(DEMO / "base").eval()
    ids = torch.tensor([prompt])
    ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                      eos_token_id=None, pad_token_id=0)  # fmt: skip
    assert got.tokens["a"] == ref[0, len(prompt) :].tolist()


def test_adapters_and_companions_validate_against_their_models():
    base, draft = BaseModelSpec.from_dir(DEMO / "base"), BaseModelSpec.from_dir(DEMO / "draft")
    for name in ADAPTERS:
        adapter = load_adapter(DEMO / "adapters" / name, base=base)
        assert adapter.rank == 8
        companion = load_adapter(DEMO / "adapters" / name / "draft", base=draft)
        assert companion.rank == 8
    with pytest.raises(Exception, match="layer"):  # a base adapter does not fit the 1-layer draft
        load_adapter(DEMO / "adapters" / "upper", base=draft)


def _outputs(engine, tokenizer, version):
    prompts = [tokenizer.encode(p) for p in RAW]
    prompts += [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True
            )
        )
        for q in CHAT
    ]
    got = Collector()
    params = SamplingParams(max_tokens=48, temperature=0.0, repetition_penalty=1.2)
    for i, p in enumerate(prompts):
        engine.submit(GenerateRequest(f"{version}-{i}", tuple(p), params, version), got.sink)
    engine.run_until_idle()
    return [tokenizer.decode(got.tokens[f"{version}-{i}"]) for i in range(len(prompts))]


@pytest.mark.slow
def test_each_adapter_changes_greedy_output_its_own_way():
    engine, versions = demo_engine()
    tok = engine.tokenizer
    known = transforms.known_words(corpus.load_corpus().train)  # the words of the training text
    base = _outputs(engine, tok, None)
    by_name = {t.name: t for t in transforms.TRANSFORMS}
    for name in ADAPTERS:
        t = by_name[name]
        adapted = _outputs(engine, tok, versions[name])
        share = sum(transforms.measure_effect(t.measure, o, known) for o in adapted) / len(adapted)
        base_share = sum(transforms.measure_effect(t.measure, o, known) for o in base) / len(base)
        assert share >= t.threshold, (name, share, adapted)
        assert share >= base_share + 0.2, (name, share, base_share)


def test_demo_config_serves_the_kit():
    cfg = load_config(DEMO.parents[1] / "configs" / "demo.yaml", base_dir=DEMO.parents[1])
    assert cfg.model.path == DEMO / "base" and cfg.model.quantization == "auto"
    assert cfg.draft.path == DEMO / "draft"
    assert cfg.draft.method in ("none", "draft_model")
    assert set(cfg.lora.preload) == set(ADAPTERS)
    for name, path in cfg.lora.preload.items():
        assert (path / "adapter_model.safetensors").exists(), name


def test_model_card_reports_the_build_figures():
    metrics = json.loads((DEMO / "metrics.json").read_text())
    card = (DEMO / "README.md").read_text()
    assert (
        f"{metrics['val_loss']['base']:.2f}" in card
        and f"{metrics['val_loss']['draft']:.2f}" in card
    )
    assert metrics["corpus"]["license"] in card


@pytest.mark.slow
def test_build_script_runs_end_to_end_in_smoke_mode(tmp_path):
    out = tmp_path / "kit"
    run = subprocess.run([sys.executable, str(DEMO / "build.py"), "--smoke", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["effects"]) == set(ADAPTERS)
    assert metrics["training"]["base"]["steps"] == 3
    loaded = load_model(out / "base", quantization="none")
    assert loaded.config.num_layers == 2
    spec = BaseModelSpec.from_dir(out / "base")
    for name in ADAPTERS:
        assert load_adapter(out / "adapters" / name, base=spec).rank == 8
