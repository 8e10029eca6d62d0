"""Shared pieces of the slab tests: adapters, a counting fake registry, and slot checks."""

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import pytest
import torch

from adapters.format.adapter import Adapter, parse_adapter
from adapters.slab.slab import AdapterSlab
from tests.adapters.factory import TINY_SPEC, peft_adapter_files

ALL = tuple(TINY_SPEC.shapes)
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
BAD = "bad@" + "0" * 64  # a version the registry fails to load


@cache
def make_adapter(rank=8, modules=("q_proj", "v_proj"), seed=0, rslora=False) -> Adapter:
    """A random PEFT adapter for TINY_SPEC with alpha 16."""
    files = peft_adapter_files(rank, 16, modules, seed, use_rslora=rslora)
    return parse_adapter(files, base=TINY_SPEC)


class Registry:
    """A loader over {"v{i}@digest": Adapter} that counts calls; it can fail or hold loads."""

    def __init__(self, *adapters: Adapter, delay: float = 0.0, gated: bool = False):
        self.adapters = {f"v{i}@{a.digest}": a for i, a in enumerate(adapters)}
        self.versions = list(self.adapters)
        self.calls: Counter[str] = Counter()
        self.fail: dict[str, Exception] = {}  # version -> what loading it raises
        self.gate = threading.Event() if gated else None  # if gated, loads wait until it is set
        self.entered = threading.Event()  # a load has started
        self.delay = delay
        self._lock = threading.Lock()

    def __call__(self, version: str) -> Adapter:
        with self._lock:
            self.calls[version] += 1
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        time.sleep(self.delay)
        if version in self.fail:
            raise self.fail[version]
        return self.adapters[version]


def assert_holds(slab: AdapterSlab, slot: int, adapter: Adapter) -> None:
    """A[slot, :r] == a and B[slot, :r] == b.T (0 where untargeted); scale and rank set."""
    r = adapter.rank
    assert int(slab.ranks[slot]) == r
    assert float(slab.scales[slot]) == pytest.approx(adapter.scale, rel=1e-6)
    for layer in range(TINY_SPEC.num_layers):
        for m in slab.modules:
            a_rows, b_rows = slab.lora_a(layer, m)[slot, :r], slab.lora_b(layer, m)[slot, :r]
            mod = adapter.modules.get((layer, m))  # a [r, in], b [out, r]
            zeros = (torch.zeros_like(a_rows), torch.zeros_like(b_rows))  # untargeted: exactly 0
            want_a, want_b = (mod.a, mod.b.T) if mod else zeros
            assert torch.equal(a_rows, want_a.to(slab.dtype)), (layer, m, "A")
            assert torch.equal(b_rows, want_b.to(slab.dtype)), (layer, m, "B")


def cycle(slab: AdapterSlab, *versions: str) -> None:
    """Acquire and release each version in turn."""
    for v in versions:
        slab.acquire(v)
        slab.release(v)


def in_threads(fn, n: int, meanwhile=None) -> list:
    """fn(i) on n threads (and `meanwhile()` here while they run): what each returned or raised."""
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(fn, i) for i in range(n)]
        if meanwhile is not None:
            meanwhile()
        return [f.exception(timeout=20) or f.result() for f in futures]


def device_bytes(slab) -> int:
    """Every tensor the slab holds on its device, each storage once (walked, not computed)."""
    seen, total, todo = set(), 0, [slab.contents]
    while todo:
        obj = todo.pop()
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(obj, dict):
            todo += obj.values()
        elif isinstance(obj, (list, tuple)):
            todo += [v for v in obj if not isinstance(v, (int, float, bool))]
        elif type(obj).__module__.startswith("adapters."):
            todo += vars(obj).values()
    return total
