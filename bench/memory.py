"""What a serving process holds per request: the engine and the HTTP app in one process, under load.

    python -m bench.memory                 # 64 streams, 6 windows of 384 requests; ~4 minutes
    python -m bench.memory --trace         # also tracemalloc's top growth (about 3x slower)
    python -m bench.memory --quick         # 16 streams, 3 windows of 64 requests

The demo kit's engine and the app (`serving.api.create_app` over a `LocalGenerator`, as
`bench/peers/local_server.py` serves them), driven through httpx's ASGI transport in this
process: no server, no Ray, nothing but what a replica holds for its requests. Streamed
/v1/completions, adapters round robin (bench.servers.MODELS), bench.load's prompts, 64 tokens,
greedy. After a warm-up window, each window of requests is followed by a collection and
three readings: glibc's in-use heap (mallinfo2: arenas plus mmapped blocks, which is where
native libraries' memory shows: torch, oneDNN, tokenizers, SQLite), Python's objects (gc,
by type), and with --trace the bytes Python allocated (tracemalloc), each as growth since
the warm-up and per request. Those three tell a Python leak (objects or traced bytes grow)
from native memory (only the heap grows) and from an allocator keeping freed memory (RSS
grows, the heap's in-use bytes do not).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path

import httpx

from bench.load import PROMPTS
from bench.servers import MODELS, loraserve_config


class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (malloc.h), every field a size_t, in this order
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


def heap_in_use() -> int | None:
    """Bytes glibc's malloc has handed out and not had back (arenas and mmapped blocks);
    None where the C library has no mallinfo2 (not glibc, or glibc before 2.33)."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return None
    fn.restype = _MallInfo2
    info = fn()
    return info.uordblks + info.hblkhd


def build_app(tmp: Path, streams: int):
    """The demo kit's app over an engine in this process, and its generator (to close)."""
    from serving.api import LocalGenerator, create_app, settings_from_config
    from serving.config import load_config
    from serving.deploy.app import publish_preloads
    from serving.engine.from_config import build_engine

    cfg = load_config(loraserve_config(tmp, streams))
    settings = settings_from_config(cfg)
    publish_preloads(cfg)
    generator = LocalGenerator(build_engine(cfg), cfg.server.max_queue,
                               stream_interval=cfg.server.stream_interval_ms / 1000)  # fmt: skip
    settings.ready.set()
    return create_app(generator, settings), generator


async def drive(app, first: int, count: int, streams: int, max_tokens: int) -> int:
    """count streamed requests through app, streams at a time; the number that failed."""
    failed = 0
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://127.0.0.1", timeout=600
    ) as c:
        gate = asyncio.Semaphore(streams)

        async def one(i: int) -> None:
            nonlocal failed
            body = {"prompt": PROMPTS[i % len(PROMPTS)], "model": MODELS[i % len(MODELS)],
                    "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
                    "stream": True}  # fmt: skip
            async with gate:
                r = await c.post("/v1/completions", json=body)
                failed += r.status_code != 200 or "data: [DONE]" not in r.text

        await asyncio.gather(*(one(first + i) for i in range(count)))
    return failed


def objects_by_type() -> collections.Counter:
    """How many objects the garbage collector tracks, by type name, after a collection."""
    gc.collect()
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=None, help="default 64 (16 with --quick)")
    ap.add_argument("--window", type=int, default=None, help="requests a window; default 384")
    ap.add_argument("--windows", type=int, default=None, help="default 6 (3 with --quick)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--trace", action="store_true", help="tracemalloc's growth too (slower)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    streams = args.streams or (16 if args.quick else 64)
    window = args.window or (64 if args.quick else 384)
    windows = args.windows or (3 if args.quick else 6)
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        app, generator = build_app(Path(tmp), streams)
        try:
            rows, top = measure(app, streams, window, windows, args.max_tokens, args.trace)
        finally:
            generator.close()
    print(f"Command: python -m bench.memory {' '.join(sys.argv[1:] if argv is None else argv)}")
    print("\n| requests after warm-up | failed | heap in use, MiB | KB/request | "
          "Python objects | traced MiB |\n|---:|---:|---:|---:|---:|---:|")  # fmt: skip
    for r in rows:
        print("| {} | {} | {} | {} | {} | {} |".format(*r))
    if top:
        print("\nPython's allocations that grew most from the warm-up to the last window:")
        for line in top:
            print(f"  {line}")
    return 0


def measure(app, streams, window, windows, max_tokens, trace):
    """Rows of (requests, failed, heap MiB growth, KB/request, objects, traced MiB), and
    tracemalloc's top growth lines (trace only)."""
    if trace:
        tracemalloc.start(4)
    asyncio.run(drive(app, 0, window, streams, max_tokens))  # warm-up: every adapter loads
    gc.collect()
    heap0, objects0 = heap_in_use(), objects_by_type()
    snap0 = tracemalloc.take_snapshot() if trace else None
    rows, done = [], 0
    for _ in range(windows):
        failed = asyncio.run(drive(app, window + done, window, streams, max_tokens))
        done += window
        gc.collect()
        heap = heap_in_use()
        grown = None if heap is None else heap - heap0
        traced = tracemalloc.get_traced_memory()[0] / 2**20 if trace else None
        rows.append((done, failed, "-" if grown is None else f"{grown / 2**20:+.1f}",
                     "-" if grown is None else f"{grown / done / 1024:.1f}",
                     sum(objects_by_type().values()),
                     "-" if traced is None else f"{traced:.2f}"))  # fmt: skip
        print(f"[memory] {rows[-1]}", file=sys.stderr, flush=True)
    top = []
    if trace:
        diff = tracemalloc.take_snapshot().compare_to(snap0, "lineno")
        top = [str(s) for s in diff[:10]]
        tracemalloc.stop()
    grew = objects_by_type()
    grew.subtract(objects0)
    top += [f"objects {name}: {n:+d}" for name, n in grew.most_common(5) if n > 0]
    return rows, top


if __name__ == "__main__":
    sys.exit(main())
