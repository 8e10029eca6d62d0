"""Adapters outside the decoder layers over HTTP: an embed_tokens + lm_head LoRA refused at
upload by a server without lora.embeddings, and served by one with it as the engine serves it;
trainable tokens served either way (their rows need no lora.embeddings)."""

import socket
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import torch
import uvicorn

from adapters.base_model import BaseModelSpec
from adapters.registry import Registry
from adapters.slab import AdapterSlab
from serving.api import AppSettings, LocalGenerator, create_app
from serving.engine.engine import Engine, EngineConfig
from serving.engine.request import GenerateRequest, SamplingParams
from serving.model.checkpoint import load_state_dict
from serving.model.hf_config import load_model_config
from serving.model.llama import LlamaModel
from tests.serving.api.served import ACME, KEYS, MODEL_ID
from tests.serving.engine.outer_world import outer_world

PROMPT = "outer rows over http"
MAX_TOKENS = 8


def engine_for(world, loader, embeddings: bool) -> Engine:
    model = LlamaModel(load_model_config(world.base_dir), load_state_dict(world.base_dir),
                       fp8=False, dtype=torch.float32)  # fmt: skip
    slab = AdapterSlab(BaseModelSpec.from_dir(world.base_dir), num_slots=4, max_rank=16,
                       max_cpu_loras=2, loader=loader, base_weight=model.served_weight,
                       embeddings=embeddings)  # fmt: skip
    config = EngineConfig(block_size=4, num_blocks=256, max_model_len=96)
    return Engine(model, world.tokenizer, config, slab=slab)


@contextmanager
def serve_outer(world, root, embeddings: bool):
    """served.serve's server, its slab and its upload check as lora.embeddings sets them
    (serving/api/settings.served_spec drops the outer modules without it)."""
    registry = Registry(f"file://{root / 'registry'}")
    engine = engine_for(world, lambda ref: registry.load(ref, verify=False), embeddings)
    generator = LocalGenerator(engine, 64)
    spec = BaseModelSpec.from_dir(world.base_dir)
    settings = AppSettings(
        model_id=MODEL_ID, max_model_len=engine.max_model_len, tokenizer=world.tokenizer,
        registry=registry, base_spec=spec if embeddings else spec.without_outer(),
        max_lora_rank=16, keys=KEYS, vocab_size=512,
    )  # fmt: skip
    settings.ready.set()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(generator, settings), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        generator.close()
        sock.close()


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
    engine = engine_for(world, world.adapters.__getitem__, embeddings=True)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    outs = []
    engine.submit(GenerateRequest("ref", ids, params, world.versions[source]), outs.append)
    engine.run_until_idle()
    return list(ids), [t for o in outs for t in o.new_token_ids], "".join(o.new_text for o in outs)


def test_without_embeddings_outer_lora_is_refused_and_tokens_are_served(world, tmp_path):
    with serve_outer(world, tmp_path, embeddings=False) as url:
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
    with serve_outer(world, tmp_path, embeddings=True) as url:
        r = upload(url, world, f"{source}-up", source)
        assert r.status_code == 201, r.text
        assert world.versions[source].endswith(r.json()["digest"])  # the same bytes
        assert complete(url, f"{source}-up") == text
