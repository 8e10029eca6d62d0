"""A closed-loop load generator for OpenAI-compatible servers: streamed /v1/completions.

`run_load(url, requests, concurrency)` keeps `concurrency` client streams busy until every
request is done (each stream takes the next request as soon as its last one ends) and
returns one record per request: the seconds from sending to the first chunk that carries
text (TTFT), from sending to `data: [DONE]`, the output tokens (the server's own `usage`
count when it sends one, else the text chunks), and the text. `summarize` turns the
records into the figures the tables show. Only httpx and the standard library: this
module runs in the main venv against any server, ours or a peer's.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass

import httpx

# Short Python-code openings, each ending in a newline, not a space: the demo tokenizer is
# byte-level BPE, and a prompt ending in a space makes an unusual last token that both
# servers then continue from in a state the model rarely saw.
PROMPTS = (
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Stack:\n    def __init__(self):\n",
    "def read_lines(path):\n    with open(path) as f:\n",
    "for i in range(10):\n",
    "def is_prime(n):\n    if n < 2:\n",
    "class Point:\n    def __init__(self, x, y):\n",
    "def parse_args():\n    parser = argparse.ArgumentParser()\n",
    "try:\n    import json\nexcept ImportError:\n",
    "def merge(a, b):\n    result = []\n",
    "with open('data.txt') as f:\n",
    "def __repr__(self):\n",
    "if __name__ == '__main__':\n",
    "def quicksort(items):\n    if len(items) <= 1:\n",
    "class Config(dict):\n    def __getattr__(self, name):\n",
    "def flatten(nested):\n    for item in nested:\n",
)


def workload(num: int, models: list[str], seed: int = 0) -> list[dict]:
    """num requests: prompts drawn from PROMPTS by a seeded generator, models round-robin."""
    rng = random.Random(seed)
    return [{"prompt": rng.choice(PROMPTS), "model": models[i % len(models)]} for i in range(num)]


@dataclass
class Record:
    """One request's outcome; times are seconds from sending the request."""

    index: int
    ttft: float | None = None
    seconds: float | None = None
    tokens: int = 0
    text: str = ""
    error: str | None = None


async def stream_request(client: httpx.AsyncClient, url: str, index: int, body: dict) -> Record:
    """One streamed /v1/completions request (body as sent) read to its end, as a Record."""
    rec, usage, chunks = Record(index), None, 0
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators and ": ping" comments
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    rec.error = str(event["error"])[:200]
                    return rec
                usage = event.get("usage") or usage
                for choice in event.get("choices") or ():
                    if choice.get("text"):
                        if rec.ttft is None:
                            rec.ttft = time.perf_counter() - t0
                        rec.text += choice["text"]
                        chunks += 1
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: a chunk that is not JSON
        rec.error = f"{type(exc).__name__}: {exc}"[:200]
        return rec
    rec.seconds = time.perf_counter() - t0
    # A chunk may carry several tokens (or a token none, while its bytes are incomplete),
    # so the count is the server's own when it gives one.
    rec.tokens = int(usage["completion_tokens"]) if usage else chunks
    return rec


async def _run(url: str, requests: list[dict], concurrency: int, extra: dict, timeout: float):
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(requests)):
        queue.put_nowait(i)
    records: list[Record] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        t_origin = time.perf_counter()

        async def stream() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                body = {**requests[i], **extra, "stream": True}
                records.append(await stream_request(client, url, i, body))

        await asyncio.gather(*(stream() for _ in range(concurrency)))
        wall = time.perf_counter() - t_origin
    records.sort(key=lambda r: r.index)
    return records, wall


def run_load(
    url: str,
    requests: list[dict],
    concurrency: int,
    *,
    max_tokens: int = 64,
    timeout: float = 300.0,
) -> tuple[list[Record], float]:
    """Send every request, `concurrency` at a time; return the records and the wall seconds."""
    extra = {
        "max_tokens": max_tokens,
        "temperature": 0.0,
        # vLLM's extra field; a server without it (loraserve ignores unknown fields) may stop
        # at an end token, so the token counts are what was produced, not max_tokens.
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    return asyncio.run(_run(url.rstrip("/"), requests, concurrency, extra, timeout))


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank q-th percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summarize(records: list[Record], wall: float) -> dict:
    """Requests, errors, output tokens, wall seconds, tokens/s and TTFT p50/p99 in ms."""
    done = [r for r in records if r.error is None]
    ttfts = [r.ttft * 1000 for r in done if r.ttft is not None]
    tokens = sum(r.tokens for r in done)
    return {
        "requests": len(records),
        "errors": len(records) - len(done),
        "output_tokens": tokens,
        "seconds": wall,
        "tok_s": tokens / wall if wall > 0 else 0.0,
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p99_ms": percentile(ttfts, 99),
        "first_error": next((r.error for r in records if r.error), None),
    }


def same_text(a: list[Record], b: list[Record]) -> int:
    """How many requests' texts agree, where one may stop early (an end token) and be a prefix."""
    return sum(
        1
        for x, y in zip(a, b, strict=True)
        if x.error is None
        and y.error is None
        and (x.text.startswith(y.text) or y.text.startswith(x.text))
    )
