"""What bench/soak.py sends a server: closed-loop streams over a list of models, distinct
copies of the demo adapters to rotate through, and OpenAI batches run one after another.

Streams: each client sends a streamed /v1/completions request (bench/load.py's prompts, the
models round robin) and the next as soon as it ends, until the time is up; requests in
flight then finish and count. Copies: the demo's three adapters (upper, comment, rot13) in
turn, every lora_A and lora_B tensor scaled per element by 1 + 0.05 * N(0, 1) from the
copy's own seed, so that each copy behaves like its source but has bytes (and a registry
version) of its own. Batches: a JSONL file of completions over the same models is uploaded
(POST /v1/files) and run (POST /v1/batches), polled each second, and submitted again each
time one completes; at the end the running one is cancelled and its finished items kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch
import yaml
from safetensors.torch import load_file, save_file

from adapters.format.base_model import BaseModelSpec
from adapters.format.sources import CONFIG, WEIGHTS
from adapters.slab.pages import page_costs
from bench.load import PROMPTS, Record, stream_request
from bench.servers import ADAPTERS, DEMO, ROOT

POLL_S = 1.0
RUNNING = ("validating", "in_progress", "finalizing", "cancelling")  # OpenAI's unfinished states
CANCEL_WAIT_S = 120.0  # a cancelled batch's running items finish first


def sampling(max_tokens: int) -> dict:
    """The fields every soak request carries: greedy, exactly max_tokens new tokens."""
    return {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}


async def streams(url: str, clients: int, seconds: float, max_tokens: int, models: list[str]):
    """Closed-loop streams until `seconds` have passed: (records, the perf_counter at which
    each ended, the wall seconds)."""
    extra = {**sampling(max_tokens), "stream": True, "stream_options": {"include_usage": True}}
    records: list[Record] = []
    ends: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=300.0, limits=limits) as client:
        t0 = time.perf_counter()

        async def one_client(k: int) -> None:
            n = 0
            while time.perf_counter() - t0 < seconds:
                i = k + n * clients  # every client walks its own share of prompts and models
                body = {"prompt": PROMPTS[i % len(PROMPTS)], "model": models[i % len(models)]}
                records.append(await stream_request(client, url, i, {**body, **extra}))
                ends.append(time.perf_counter())
                n += 1

        await asyncio.gather(*(one_client(k) for k in range(clients)))
        return records, ends, time.perf_counter() - t0


def adapter_copies(folder: Path, num: int) -> dict[str, Path]:
    """Write `num` perturbed copies of the demo adapters under folder; {name: path}."""
    sources = [load_file(DEMO / "adapters" / name / WEIGHTS) for name in ADAPTERS]
    copies = {}
    for i in range(num):
        name, gen = f"soak-{i:04d}", torch.Generator().manual_seed(i)
        tensors = {k: t * (1 + 0.05 * torch.randn(t.shape, generator=gen))
                   for k, t in sources[i % len(sources)].items()}  # fmt: skip
        path = folder / name
        path.mkdir(parents=True)
        save_file(tensors, path / WEIGHTS, metadata={"format": "pt"})
        config = DEMO / "adapters" / ADAPTERS[i % len(ADAPTERS)] / CONFIG
        (path / CONFIG).write_bytes(config.read_bytes())
        copies[name] = path
    return copies


def slab_for(num: int) -> tuple[int, int]:
    """(lora.slab_mb, how many of the rank-8 copies it holds): a slab for about half of
    `num`, so that a rotation over all of them loads and evicts on every turn."""
    spec = BaseModelSpec.from_config(json.loads((DEMO / "base" / "config.json").read_text()))
    demo = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    costs = page_costs(spec, max_rank=demo["lora"]["max_lora_rank"])  # fp32, as the demo runs
    rank = json.loads((DEMO / "adapters" / ADAPTERS[0] / CONFIG).read_text())["r"]
    per_copy = costs.pages_of(rank)
    pages = max(num // 2 * per_copy, costs.pages_of(costs.max_rank))
    slab_mb = -(-costs.bytes_for(pages) // 2**20)
    return slab_mb, costs.pages_for(slab_mb << 20) // per_copy


@dataclass
class BatchTally:
    """The batches a soak ran: how many were submitted and completed, and their items."""

    submitted: int = 0
    completed: int = 0  # batches that ran to their end
    items_done: int = 0
    items_failed: int = 0
    last: str = "none"  # the last batch's id and final status
    error: str | None = None  # a refused upload, submission or poll

    def describe(self) -> str:
        if not self.submitted and not self.error:
            return "-"
        text = (f"{self.items_done} items done, {self.items_failed} failed; batches: "
                f"{self.submitted} submitted, {self.completed} completed, last {self.last}")  # fmt: skip
        return text + (f"; error: {self.error}" if self.error else "")


async def batches(url: str, models: list[str], items: int, max_tokens: int,
                  stop: asyncio.Event) -> BatchTally:  # fmt: skip
    """Run `items`-line batches one after another until stop is set; the tally once the
    last one (cancelled at stop) has ended."""
    tally = BatchTally()
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        try:
            while not stop.is_set():
                job = await _submit(client, models, items, max_tokens, tally.submitted)
                tally.submitted += 1
                while job["status"] in RUNNING and not stop.is_set():
                    await _wait(stop, POLL_S)
                    job = await _call(client, "GET", f"/v1/batches/{job['id']}")
                if job["status"] in RUNNING:  # stopped while it ran
                    job = await _call(client, "POST", f"/v1/batches/{job['id']}/cancel")
                    deadline = time.perf_counter() + CANCEL_WAIT_S
                    while job["status"] in RUNNING and time.perf_counter() < deadline:
                        await asyncio.sleep(POLL_S)
                        job = await _call(client, "GET", f"/v1/batches/{job['id']}")
                counts = job["request_counts"]
                tally.items_done += counts["completed"]
                tally.items_failed += counts["failed"]
                tally.completed += job["status"] == "completed"
                tally.last = f"{job['id']} {job['status']}"
        except RuntimeError as exc:
            tally.error = str(exc)
    return tally


async def _submit(client: httpx.AsyncClient, models, items, max_tokens, number) -> dict:
    lines = [{"custom_id": f"b{number}-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": models[i % len(models)], "prompt": PROMPTS[i % len(PROMPTS)],
                       **sampling(max_tokens)}}
             for i in range(items)]  # fmt: skip
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    upload = await _call(client, "POST", "/v1/files", data={"purpose": "batch"},
                         files={"file": (f"soak-{number}.jsonl", content)})  # fmt: skip
    body = {"input_file_id": upload["id"], "endpoint": "/v1/completions"}
    return await _call(client, "POST", "/v1/batches", json=body)


async def _call(client: httpx.AsyncClient, method: str, path: str, **kw) -> dict:
    """One API call's JSON; RuntimeError naming the call unless it answers 200."""
    try:
        resp = await client.request(method, path, **kw)
    except httpx.HTTPError as exc:
        raise RuntimeError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
    if resp.status_code != 200:
        raise RuntimeError(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:200]}")
    return resp.json()


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
