"""The two kinds of traffic bench/batch_api.py sends one server: closed-loop interactive
clients streaming /v1/chat/completions, and a Workers-AI batch submitted and polled to its end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass

import httpx

from bench.load import PROMPTS
from bench.servers import ADAPTERS

MODELS = ["demo", *ADAPTERS]  # "demo": the base model
POLL_S = 0.25


@dataclass
class Chat:
    start: float  # perf_counter at sending
    ttft: float | None = None
    seconds: float | None = None
    error: str | None = None


async def chat(client: httpx.AsyncClient, url: str, body: dict) -> Chat:
    rec = Chat(time.perf_counter())
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return rec
            async for line in resp.aiter_lines():
                data = line[5:].strip() if line.startswith("data:") else ""
                if not data or data == "[DONE]":
                    continue
                event = json.loads(data)
                if "error" in event:
                    rec.error = str(event["error"])[:200]
                    return rec
                content = any(c.get("delta", {}).get("content") for c in event.get("choices", ()))
                if content and rec.ttft is None:
                    rec.ttft = time.perf_counter() - rec.start
    except (httpx.HTTPError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:200]
        return rec
    rec.seconds = time.perf_counter() - rec.start
    return rec


async def clients(url: str, n: int, stop: asyncio.Event, args, seed: int) -> list[Chat]:
    """n closed-loop clients, each with a think time, until stop is set."""
    records: list[Chat] = []

    async def one(rng: random.Random) -> None:
        async with httpx.AsyncClient(timeout=300) as client:
            while not stop.is_set():
                body = {"model": rng.choice(MODELS), "stream": True, "temperature": 0,
                        "max_tokens": args.max_tokens,
                        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]}  # fmt: skip
                records.append(await chat(client, url, body))
                with_jitter = args.think_s * rng.uniform(0.5, 1.5)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), with_jitter)

    await asyncio.gather(*(one(random.Random(seed * 1000 + i)) for i in range(n)))
    return records


def batch_items(n: int, max_tokens: int) -> list[dict]:
    rng = random.Random(0)
    items = []
    for i in range(n):
        item = {"prompt": rng.choice(PROMPTS), "max_tokens": max_tokens, "temperature": 0,
                "external_reference": f"r{i}"}  # fmt: skip
        if MODELS[i % len(MODELS)] != "demo":
            item["lora"] = MODELS[i % len(MODELS)]
        items.append(item)
    return items


async def run_batch(url: str, items: list[dict]) -> dict:
    """Submit, poll until done; seconds from submission to the poll that saw it done."""
    async with httpx.AsyncClient(timeout=300) as client:
        t0 = time.perf_counter()
        resp = await client.post(url + "/ai/run/demo?queueRequest=true", json={"requests": items})
        if resp.status_code != 200:
            raise RuntimeError(f"batch submit: HTTP {resp.status_code}: {resp.text[:300]}")
        job = resp.json()["result"]["request_id"]
        while True:
            await asyncio.sleep(POLL_S)
            resp = await client.post(url + "/ai/run/demo", json={"request_id": job})
            if resp.status_code != 200:
                raise RuntimeError(f"batch poll: HTTP {resp.status_code}: {resp.text[:300]}")
            result = resp.json()["result"]
            if result["status"] not in ("queued", "running"):
                break
        seconds = time.perf_counter() - t0
    if result["status"] != "done" or result["failed"]:
        first = next((r for r in result.get("responses", ()) if not r["success"]), None)
        raise RuntimeError(f"batch {job} ended {result['status']}, {result['failed']} failed: "
                           f"{first}")  # fmt: skip
    tokens = result["usage"]["completion_tokens"]
    return {"seconds": seconds, "items": result["completed"], "tokens": tokens,
            "items_s": result["completed"] / seconds, "tokens_s": tokens / seconds}  # fmt: skip
