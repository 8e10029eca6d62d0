"""Adapters outside the decoder layers over HTTP: an embed_tokens + lm_head LoRA refused at
upload by a server without lora.embeddings, and served by one with it as the engine serves it;
trainable tokens served either way (their rows need no lora.embeddings)."""

import httpx
import pytest

from serving.engine.request import GenerateRequest, SamplingParams
from tests.serving.api.served import ACME, build_engine, serve
from tests.serving.engine.outer_world import outer_world

PROMPT = "outer rows over http"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return outer_world(tmp_path_factory.mktemp("outer-http") / "world")


def upload(url, world, name, source):
    adapter = world.adapters[world.versions[source]]
    files = {
        "adapter_config.json": ("adapter_config.json", adapter.config_bytes),
        "adapter_model.safetensors": ("adapter_model.safetensors", adapter.weights_bytes),
    }
    return httpx.post(f"{url}/v1/adapters", data={"name": name}, files=files,
                      headers={"Authorization": f"Bearer {ACME}"}, timeout=60)  # fmt: skip


def complete(url, model):
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body,
                   headers={"Authorization": f"Bearer {ACME}"}, timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def engine_reference(world, source):
    """Greedy tokens and text of the prompt run alone on an engine with embeddings."""
    ids = tuple(world.tokenizer.encode(PROMPT))
    engine = build_engine(world, world.adapters.__getitem__, embeddings=True)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    outs = []
    engine.submit(GenerateRequest("ref", ids, params, world.versions[source]), outs.append)
    engine.run_until_idle()
    return list(ids), [t for o in outs for t in o.new_token_ids], "".join(o.new_text for o in outs)


def test_without_embeddings_outer_lora_is_refused_and_tokens_are_served(world, tmp_path):
    with serve(world, tmp_path, publish=(), embeddings=False) as served:
        url = served.url
        r = upload(url, world, "outer-up", "outer")
        assert r.status_code == 400, r.text
        assert "lora.embeddings" in r.text
        r = upload(url, world, "tokens-up", "tokens")
        assert r.status_code == 201, r.text
        assert complete(url, "tokens-up") == engine_reference(world, "tokens")[2]


@pytest.mark.parametrize("source", ["outer", "tokens"])
def test_with_embeddings_generates_what_the_engine_and_peft_generate(world, tmp_path, source):
    ids, tokens, text = engine_reference(world, source)
    assert tokens == world.reference(ids, source, MAX_TOKENS)[: len(tokens)]  # PEFT, no EOS
    with serve(world, tmp_path, publish=(), embeddings=True) as served:
        url = served.url
        r = upload(url, world, f"{source}-up", source)
        assert r.status_code == 201, r.text
        assert world.versions[source].endswith(r.json()["digest"])  # the same bytes
        assert complete(url, f"{source}-up") == text
