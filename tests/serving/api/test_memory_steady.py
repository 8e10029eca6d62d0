"""Once warm, a serving process holds no more memory for the requests it serves: the demo
kit's engine and the HTTP app in this process (as bench/peers/local_server.py runs them),
driven through httpx's ASGI transport, hold as much native heap and as many Python objects
after the measured requests as after the warm-up, within a small slack.

The load makes a step's batch vary from step to step (streamed and not, the base model and
three adapters, prompts of 1 to 16 code openings, 1 to 16 tokens, 32 at a time), so that a
cache keyed by a batch's row count shows: oneDNN's primitive caches under the packed CPU
linears (kernels/cpu_gemm.py) grew with every new row count until its ROW_BUCKETS.
"""

from __future__ import annotations

import asyncio
import gc
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch

from bench.load import PROMPTS
from bench.memory import heap_in_use, objects_by_type
from bench.servers import MODELS, loraserve_config
from serving.api import LocalGenerator, create_app, settings_from_config
from serving.config import load_config
from serving.deploy.app import publish_preloads
from serving.engine.from_config import build_engine

STREAMS = 32  # requests in flight, and the engine's max_num_seqs
# The heap settles after about a thousand requests of this load (oneDNN builds the last of
# its primitives as late batches hit new row buckets): measured 1.7 and 2.8 MiB over the
# 384 requests after 256 and after 640, then 0.0 and 0.04 MiB.
WARM_UP, MEASURED = 1024, 512
# Heap the process may gain per measured request. Warm, it gains under 1 KB a request (well
# under 1 MB in all, once, then flat); before ROW_BUCKETS it gained ~65 KB a request under
# 64 streams of 64 tokens and ~180 KB under this load. 4 KB (2 MB in all) also leaves room
# for a few oneDNN primitives (~0.6 MB each) that the warm-up happened not to build.
HEAP_PER_REQUEST = 4 << 10
# Objects of one type the process may gain over the measured requests: the app's recent
# window (serving.api.core.recent) keeps a bucket per second and label for 30 s (here at
# most ~31 x 4), and each asyncio.run leaves a few dozen weak references and methods behind.
# A leak of one object a request would show MEASURED of them.
OBJECT_SLACK = 256


@contextmanager
def demo_app(root: Path) -> Iterator[object]:
    """The demo kit's app over an engine in this process; torch's threads restored after."""
    threads = torch.get_num_threads()  # build_engine sets them to the replica's CPUs
    cfg = load_config(loraserve_config(root, STREAMS))
    settings = settings_from_config(cfg)
    publish_preloads(cfg)  # the slab loads adapters from the registry, as a replica's does
    generator = LocalGenerator(build_engine(cfg), cfg.server.max_queue)
    settings.ready.set()
    try:
        yield create_app(generator, settings)
    finally:
        generator.close()
        torch.set_num_threads(threads)


def body(i: int) -> dict:
    """The i-th request of the load, the same on every run."""
    rng = random.Random(i)
    return {
        "prompt": rng.choice(PROMPTS) * rng.randint(1, 16),
        "model": MODELS[i % len(MODELS)],
        "max_tokens": rng.randint(1, 16),
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": rng.random() < 0.5,
    }


def drive(app, requests: range) -> list[str]:
    """Send the requests, STREAMS at a time; what went wrong with any of them."""

    async def run() -> list[str]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1", timeout=120
        ) as client:
            gate = asyncio.Semaphore(STREAMS)

            async def one(i: int) -> str | None:
                sent = body(i)
                async with gate:
                    r = await client.post("/v1/completions", json=sent)
                if r.status_code != 200:
                    return f"request {i}: {r.status_code} {r.text[:200]}"
                if sent["stream"]:
                    ended = r.text.rstrip().endswith("data: [DONE]")
                    return None if ended else f"request {i}: the stream did not end in [DONE]"
                tokens = r.json()["usage"]["completion_tokens"]
                if tokens != sent["max_tokens"]:
                    return f"request {i}: {tokens} tokens, asked for {sent['max_tokens']}"
                return None

            return [e for e in await asyncio.gather(*map(one, requests)) if e]

    return asyncio.run(run())


@pytest.mark.slow
def test_memory_held_stops_growing_once_warm(tmp_path):
    if heap_in_use() is None:
        pytest.skip("the C library has no mallinfo2 (glibc 2.33 or later) to read its heap")
    with demo_app(tmp_path) as app:
        assert drive(app, range(WARM_UP)) == []
        objects0 = objects_by_type()  # a collection first, as before each reading
        # objects0 (~1 MB of counts) is held at both heap readings, so it cancels out
        heap0 = heap_in_use()
        assert drive(app, range(WARM_UP, WARM_UP + MEASURED)) == []
        gc.collect()
        heap1 = heap_in_use()
        objects1 = objects_by_type()

    grown = heap1 - heap0
    assert grown <= HEAP_PER_REQUEST * MEASURED, (
        f"the heap grew {grown / 2**20:.1f} MiB over {MEASURED} requests once warm, "
        f"{grown / MEASURED / 1024:.1f} KB a request (at most {HEAP_PER_REQUEST >> 10} KB)"
    )
    objects1.subtract(objects0)
    grew = {name: n for name, n in objects1.most_common() if n > OBJECT_SLACK}
    assert grew == {}, f"Python objects grew over {MEASURED} requests once warm: {grew}"
