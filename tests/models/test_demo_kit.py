"""The committed demo kit: it loads like any checkpoint, and each adapter visibly does its job."""

import json
import random
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from serving.config import load_config
from serving.engine.request import GenerateRequest, ResponseFormat, SamplingParams
from serving.model.loader import load_model
from serving.model.tool_formats import HERMES, detect, structural_tag
from serving.model.tool_parse import parse_calls
from tests.models.kit import ADAPTERS, DEMO, TOOLS, corpus, demo_engine, tool_calls, transforms
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
    assert set(cfg.lora.preload) == {*ADAPTERS, TOOLS}
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
    assert set(metrics["effects"]) == {*ADAPTERS, TOOLS}
    assert metrics["training"]["base"]["steps"] == 3
    loaded = load_model(out / "base", quantization="none")
    assert loaded.config.num_layers == 2
    spec = BaseModelSpec.from_dir(out / "base")
    for name in (*ADAPTERS, TOOLS):
        assert load_adapter(out / "adapters" / name, base=spec).rank == 8


def test_the_template_offers_tools_as_transformers_renders_them():
    """The served template reads as the hermes family, and renders a chat with tools, calls
    and a tool's answer exactly as transformers does."""
    loaded = load_model(DEMO / "base", quantization="none")
    hf_tok = AutoTokenizer.from_pretrained(DEMO / "base")
    assert detect(loaded.tokenizer.chat_template) is HERMES
    tools, chat, _ = tool_calls.example(random.Random(3))
    for messages in (chat, [{"role": "user", "content": "hi"}]):
        ours = loaded.tokenizer.apply_chat_template(messages, tools=tools)
        assert ours == hf_tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                                  add_generation_prompt=True)  # fmt: skip


def test_the_tools_adapter_calls_what_is_asked_under_the_constraint():
    """Held-out requests, served with tool_choice auto's constraint: each answer is the
    call (name and arguments) or the sentence the kit's example wants."""
    engine, versions = demo_engine()
    tok = engine.tokenizer
    rng, cases, got = random.Random(11), [], Collector()
    for i in range(8):
        tools, chat, want = tool_calls.example(rng)
        functions = [(t["function"]["name"], t["function"]["parameters"], False) for t in tools]
        fmt = ResponseFormat("structural_tag",
                             json.dumps(structural_tag(HERMES, functions, "auto", True)))  # fmt: skip
        prompt = tok.encode(tok.apply_chat_template(chat, tools=tools), add_special_tokens=False)
        params = SamplingParams(max_tokens=60, temperature=0.0)
        request = GenerateRequest(
            f"t{i}", tuple(prompt), params, versions[TOOLS], response_format=fmt
        )
        engine.submit(request, got.sink)
        cases.append(want)
    engine.run_until_idle()
    for i, want in enumerate(cases):
        content, calls = parse_calls(HERMES, tok.decode(got.tokens[f"t{i}"]))
        if want.startswith("<tool_call>"):
            call = json.loads(want.removeprefix("<tool_call>").removesuffix("</tool_call>"))
            assert [(c.name, json.loads(c.arguments)) for c in calls] == [
                (call["name"], call["arguments"])
            ], i
        else:
            assert not calls and content == want, i
    engine.shutdown()
