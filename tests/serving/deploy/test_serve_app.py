"""The Ray Serve app end to end on loopback: a tiny Llama with PEFT adapters, two replicas.

Started once for the module with serve.run(build(...)); every answer is compared with an
in-process engine over the same folder running the request alone.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from serving.engine.speculative.config import SpecConfig
from serving.model.tokenizer import load_tokenizer
from tests.serving.deploy.served import (
    MODEL_ID,
    REPLICAS,
    SPEC,
    TEMPLATE,
    Served,
    free_port,
    serving,
    write_config,
)
from tests.serving.engine.world import World, build_world

# Ray's routers learn which replica loaded which multiplexed id a moment after the load.
ROUTING_UPDATE_S = 2.0
LONG = 480  # output tokens of the disconnect test; with its prompt, within max_model_len 512
CHAT = [{"role": "user", "content": "Say something in upper case."}]
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy")
    world = build_world(root / "world")
    (world.base_dir / "chat_template.jinja").write_text(TEMPLATE)
    world.tokenizer = load_tokenizer(world.base_dir)
    port = free_port()
    config = write_config(root, world, port)
    with serving(config, port, root / "home") as url:
        reference = world.engine(
            num_slots=8, max_model_len=512, speculative=SpecConfig(**SPEC), num_blocks=1024
        )
        yield Served(url, world, str(root / "registry"), reference)


def chat_ids(world: World, messages) -> list[int]:
    text = world.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return world.tokenizer.encode(text, add_special_tokens=False)


def test_readyz_and_preloads_listed(served):
    assert httpx.get(f"{served.url}/readyz").status_code == 200
    assert httpx.get(f"{served.url}/healthz").status_code == 200
    models = {m.id: m for m in served.client().models.list()}
    assert MODEL_ID in models and models[MODEL_ID].parent is None
    assert models[f"{MODEL_ID}:upper"].parent == MODEL_ID


def test_an_answer_carries_one_request_id_the_clients_when_echoable(served):
    # The replica's app names every answer itself (serving.api.edge.request_id): a client's
    # id is echoed when it is a short printable token, else replaced by one of the app's.
    for sent in ("a" * 20_000, "a" * 129, "a b", "a/b?c", ""):
        r = httpx.get(f"{served.url}/v1/models", headers={"x-request-id": sent}, timeout=30)
        (answered,) = r.headers.get_list("x-request-id")
        assert r.status_code == 200 and answered != sent and answered.startswith("req_")
    for sent in ("trace-9", "a" * 128, "a/b:c=d+e.f_g"):
        r = httpx.get(f"{served.url}/v1/models", headers={"x-request-id": sent}, timeout=30)
        assert r.headers.get_list("x-request-id") == [sent]
    body = {"model": MODEL_ID, "prompt": PROMPT, "max_tokens": 2, "stream": True}
    with httpx.stream("POST", f"{served.url}/v1/completions", json=body, timeout=30,
                      headers={"x-request-id": "trace-10"}) as streamed:  # fmt: skip
        assert streamed.headers.get_list("x-request-id") == ["trace-10"]
        assert streamed.read().endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("how", ["model", "lora"])
def test_openai_chat_and_completions_match_the_engine(served, how):
    client = served.client()
    pick = {"model": f"{MODEL_ID}:upper"} if how == "model" else {
        "model": MODEL_ID, "extra_body": {"lora": "upper"}
    }  # fmt: skip
    want_chat = served.expected(chat_ids(served.world, CHAT), "upper", 12)
    outs = served.alone(served.world.tokenizer.encode(PROMPT), "upper", 12)
    want_text = "".join(o.new_text for o in outs)
    assert want_chat and want_text

    chat = client.chat.completions.create(messages=CHAT, max_tokens=12, temperature=0, **pick)
    assert chat.choices[0].message.content == want_chat
    stream = client.chat.completions.create(
        messages=CHAT, max_tokens=12, temperature=0, stream=True, **pick
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want_chat

    done = client.completions.create(prompt=PROMPT, max_tokens=12, temperature=0, **pick)
    assert done.choices[0].text == want_text
    assert done.usage.completion_tokens == outs[-1].completion_tokens
    stream = client.completions.create(
        prompt=PROMPT, max_tokens=12, temperature=0, stream=True, **pick
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == want_text


def test_sixteen_concurrent_requests_mixing_adapters(served):
    from adapters.format.adapter import load_adapter
    from adapters.registry.registry import Registry

    registry = Registry(served.registry)
    for name in ("rot13", "mlp"):  # published beside the preload, as `--registry` would
        registry.publish(name, load_adapter(served.world.root / name))
    names = ["upper", "rot13", "mlp", None] * 4
    prompts = [f"{PROMPT} number {i}" for i in range(16)]
    want = [
        served.expected(served.world.tokenizer.encode(p), n, 10) for p, n in zip(prompts, names)
    ]
    client = AsyncOpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)

    async def one(prompt, name):
        model = f"{MODEL_ID}:{name}" if name else MODEL_ID
        done = await client.completions.create(
            model=model, prompt=prompt, max_tokens=10, temperature=0
        )
        return done.choices[0].text

    async def all_at_once():
        return await asyncio.gather(*(one(p, n) for p, n in zip(prompts, names)))

    assert asyncio.run(all_at_once()) == want


def _cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "loraserve"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)


def test_upload_use_reupload_delete(served):
    world, url = served.world, served.url
    client = served.client()
    ids = world.tokenizer.encode(PROMPT)

    def complete():
        done = client.completions.create(
            model=f"{MODEL_ID}:fresh", prompt=PROMPT, max_tokens=10, temperature=0
        )
        return done.choices[0].text

    first = _cli("adapters", "upload", str(world.root / "qk"), "--name", "fresh", "--server", url)
    assert first.returncode == 0, first.stderr
    assert complete() == served.expected(ids, "qk", 10)  # served by the very next request

    again = _cli("adapters", "upload", str(world.root / "ov"), "--name", "fresh", "--server", url)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() != first.stdout.strip()  # a new version
    assert complete() == served.expected(ids, "ov", 10)
    assert served.expected(ids, "ov", 10) != served.expected(ids, "qk", 10)

    gone = _cli("adapters", "delete", "fresh", "--server", url)
    assert gone.returncode == 0, gone.stderr
    answer = httpx.post(
        f"{url}/v1/completions",
        json={"model": f"{MODEL_ID}:fresh", "prompt": PROMPT, "max_tokens": 4},
    )
    assert answer.status_code == 404, answer.text


def test_metrics_parse_count_and_carry_engine_snapshot(served):
    def requests_total(families):
        return sum(s.value for s in families["loraserve_requests"] if s.name.endswith("_total"))

    before = served.metrics()
    served.client().completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=3, temperature=0)
    after = served.metrics()
    assert requests_total(after) == requests_total(before) + 1
    for name in ("loraserve_num_requests_running", "loraserve_kv_cache_usage_ratio"):
        replicas = {s.labels["replica"] for s in after[name]}
        assert len(replicas) == REPLICAS and all(replicas), (name, replicas)  # every replica
    assert any(s.value > 0 for s in after["loraserve_prefix_cache_queried_tokens"])
    # each replica's app and routing tables come with its engine's, through Ray
    states = {(s.labels["replica"], s.labels["state"]) for s in after["loraserve_state_entries"]}
    for state in ("prefix_cache_blocks", "schema_checks", "routing_ids", "routing_in_flight"):
        assert len({r for r, name in states if name == state}) == REPLICAS, state


def test_adapter_requests_go_where_it_is_hot(served):
    from adapters.format.adapter import load_adapter
    from adapters.registry.registry import Registry

    Registry(served.registry).publish("down", load_adapter(served.world.root / "down"))

    def loads() -> float:
        return sum(s.value for s in served.metrics()["loraserve_adapter_loads"])

    def complete() -> None:
        served.client().completions.create(
            model=f"{MODEL_ID}:down", prompt=PROMPT, max_tokens=2, temperature=0
        )

    before = loads()
    complete()
    time.sleep(ROUTING_UPDATE_S)
    for _ in range(5):  # without adapter routing, some would land on the other replica
        complete()
    assert loads() == before + 1  # one replica loaded it, once


def _running(served) -> float:
    return sum(s.value for s in served.metrics()["loraserve_num_requests_running"])


def test_client_disconnect_aborts_the_request(served):
    world = served.world
    # A prompt whose greedy output runs long: an unaborted request would compute all of it.
    prompt = world.tokenizer.encode(PROMPT + " again and again")
    full = [t for o in served.alone(prompt, None, LONG) for t in o.new_token_ids]
    assert len(full) == LONG, "pick a prompt that does not stop early"
    # One session, so the follow-up below reaches the same replica and its prefix cache.
    session = {"x-session-affinity": "disconnect-test"}
    body = {"model": MODEL_ID, "prompt": prompt, "max_tokens": LONG, "temperature": 0,
            "stream": True}  # fmt: skip
    url = f"{served.url}/v1/completions"
    with httpx.stream("POST", url, json=body, headers=session, timeout=60) as answer:
        assert answer.status_code == 200
        lines = answer.iter_lines()
        while not next(lines).startswith("data: {"):
            pass  # the first token came: leave at once, mid-stream
    deadline = time.monotonic() + 30
    while _running(served) != 0:
        assert time.monotonic() < deadline, "the request still runs after the client left"
        time.sleep(0.05)
    time.sleep(ROUTING_UPDATE_S)
    # What the engine computed is in its prefix cache: the same prompt followed by the full
    # output finds the prompt and the tokens made before the abort, not all of them.
    follow = served.client().completions.create(
        model=MODEL_ID, prompt=prompt + full, max_tokens=1, temperature=0,
        extra_headers=session,
    )  # fmt: skip
    cached = follow.usage.prompt_tokens_details.cached_tokens
    assert follow.usage.prompt_tokens == len(prompt) + LONG
    assert len(prompt) - 4 < cached < len(prompt) + LONG // 2, (len(prompt), cached)
