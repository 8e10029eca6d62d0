"""PEFT's LoRA variants through the HTTP API: a DoRA adapter and a rank_pattern + alpha_pattern
adapter uploaded by POST /v1/adapters, then /v1/completions greedy text as PEFT generates it."""

import httpx
import pytest

from tests.serving.api.served import ACME, serve
from tests.serving.engine.variants import variant_world

PROMPTS = ("variants over http", "the quick brown fox")
MAX_TOKENS = 8


def auth(key):
    return {"Authorization": f"Bearer {key}"}


def upload(served, name, source):
    adapter = served.world.adapters[served.world.versions[source]]
    files = {
        "adapter_config.json": ("adapter_config.json", adapter.config_bytes),
        "adapter_model.safetensors": ("adapter_model.safetensors", adapter.weights_bytes),
    }
    return httpx.post(f"{served.url}/v1/adapters", data={"name": name}, files=files,
                      headers=auth(ACME), timeout=60)  # fmt: skip


def complete(served, model, prompt):
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    r = httpx.post(f"{served.url}/v1/completions", json=body, headers=auth(ACME), timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("variants-http")
    with serve(variant_world(root / "world"), root, publish=()) as s:
        yield s


@pytest.mark.parametrize("source", ["dora", "patterns"])
def test_an_uploaded_variant_generates_what_peft_generates(served, source):
    r = upload(served, f"{source}-up", source)
    assert r.status_code == 201, r.text
    assert served.world.versions[source].endswith(r.json()["digest"])  # the same bytes
    base_texts = []
    for prompt in PROMPTS:
        ids = served.text_ids(prompt)
        peft = served.world.reference(ids, source, MAX_TOKENS)  # transformers + PEFT, no EOS
        tokens, text = served.reference(ids, source, MAX_TOKENS)  # the engine, stopping at EOS
        assert tokens == peft[: len(tokens)] and text == served.world.tokenizer.decode(tokens)
        assert complete(served, f"{source}-up", prompt) == text
        base_texts.append(served.reference(ids, None, MAX_TOKENS)[1])
    # the adapter really steers the answer: the base model alone says something else
    assert [complete(served, f"{source}-up", p) for p in PROMPTS] != base_texts
