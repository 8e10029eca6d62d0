"""The adapter slab: one model replica's device-resident LoRA weights, in pages of rows.

For every layer and targetable module the slab holds the stacks the LoRA kernels read
(kernels/lora_ops.py), preallocated once, as `num_pages` pages of `page_rank` rows. A
rank-r adapter holds ceil(r / page_rank) contiguous pages, and its slot, the index the
kernels and steps use, is its first page: the stacks are views in which slot p reaches
max_rank rows from page p (adapters/slab/stacks.py), so `stack[slot, :r]` is exactly the
adapter's rows, and a rank-8 adapter takes 1/8 of what a rank-64 one takes. Beside the
stacks, per page, a scale and a rank (0: no adapter's slot), lora_B biases and DoRA's
output scales; a small pool of trainable-token slots; what a page holds, and how it is
filled and emptied, is adapters/slab/slots.py. With `embeddings`, the embedding's and the
LM head's stacks are kept too, under layer -1.

The slab is sized by `num_slots` (room for that many max_rank adapters) or `slab_bytes`
(as many pages as the bytes hold: adapters/slab/pages.py, which config code sizes with).

Adapters move registry (the `loader`) -> host tier (an LRU in CPU memory) -> pages.
`acquire` pins a version for as long as a request uses it and `release` unpins it; only
unpinned adapters are evicted: a load takes the lowest free run of its pages, else the run
whose most recently used occupant is least recent (adapters/slab/alloc.py). One lock guards
the bookkeeping; registry fetches and tensor copies run outside it, into pages reserved for
that load, which no reader touches until the load marks them resident (the load itself:
adapters/slab/loading.py).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import torch

from adapters.format.adapter import Adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.alloc import PageMap
from adapters.slab.host_cache import HostCache, check_fits
from adapters.slab.loading import SlabLoads
from adapters.slab.pages import count_pages, page_costs
from adapters.slab.reads import SlabReads
from adapters.slab.slots import SlotContents
from adapters.slab.stats import COUNTED, SlabFull, SlabStats
from adapters.slab.vectors import BaseWeight


class AdapterSlab(SlabReads, SlabLoads):
    """Device pages of LoRA weights for one model replica, filled on demand."""

    def __init__(
        self,
        spec: BaseModelSpec,
        *,
        max_rank: int,
        loader: Callable[[str], Adapter],
        num_slots: int | None = None,
        slab_bytes: int | None = None,
        max_cpu_loras: int | None = None,
        host_bytes: int | None = None,
        page_rank: int = 8,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        modules: Sequence[str] | None = None,
        prefetch_workers: int = 2,
        base_weight: BaseWeight | None = None,
        embeddings: bool = False,
        max_tokens: int = 64,
        token_slots: int = 16,
    ) -> None:
        if max_rank < 1 or page_rank < 1:
            raise ValueError(f"max_rank and page_rank must be >= 1, got {max_rank}, {page_rank}")
        self.modules = tuple(spec.shapes if modules is None else modules)
        unknown = sorted(set(self.modules) - set(spec.shapes))
        if unknown:
            raise ValueError(f"modules {unknown} are not in the base model ({list(spec.shapes)})")
        self.costs = page_costs(
            spec, max_rank=max_rank, page_rank=page_rank, dtype=dtype, modules=self.modules,
            embeddings=embeddings, max_tokens=max_tokens, token_slots=token_slots,
        )  # fmt: skip
        self.num_pages = count_pages(self.costs, num_slots=num_slots, slab_bytes=slab_bytes)
        self.num_slots = self.num_pages  # the kernels' index space: a slot is a first page
        self.page_rank = self.costs.page_rank  # clamped to max_rank
        self.spec, self.max_rank, self.dtype = spec, max_rank, dtype
        self.device = torch.device(device)
        # The embedding's and LM head's stacks are vocabulary-wide: only when asked for.
        self.outer = tuple(spec.outer_shapes) if embeddings else ()
        # Not inference tensors (a caller's inference_mode): loader threads write them in place.
        with torch.inference_mode(False):
            self.contents = SlotContents(
                spec, self.modules, self.outer, num_pages=self.num_pages,
                page_rank=self.page_rank, max_rank=max_rank, max_tokens=max_tokens,
                token_slots=token_slots, base_weight=base_weight, dtype=dtype, device=self.device,
            )  # fmt: skip
        # What the model runtime reads, by the names it reads them by (see SlotContents).
        c = self.contents
        self.stacks, self.vectors, self.tokens = c.stacks, c.vectors, c.tokens
        self.scales, self.ranks, self.host_ranks, self.host_scales = (
            c.scales, c.ranks, c.host_ranks, c.host_scales
        )  # fmt: skip
        self.keys = frozenset(self.stacks.a)  # every (layer, module) the slab holds
        self._lock = threading.Lock()
        check = partial(
            check_fits, spec=spec, modules=self.modules, max_rank=max_rank, outer=self.outer
        )
        # Pinned host memory only pays off when the copies go to a GPU.
        pin = self.device.type == "cuda"
        self._host = HostCache(
            max_cpu_loras, loader, check, lock=self._lock, pin=pin, max_bytes=host_bytes
        )
        self._pages = PageMap(self.num_pages, self.tokens.num_slots)  # resident and loading
        self._pins: Counter[str] = Counter()  # resident or loading versions' pins
        self._resident: OrderedDict[str, int] = OrderedDict()  # version -> slot, LRU first
        self._loading: dict[str, Future[int]] = {}  # version -> its load
        self._counts: Counter[str] = Counter()
        self._load_seconds = 0.0
        self._closed = False
        # One intra-op thread per loader: a background thread running a parallel op (DoRA's
        # norms) gets an OpenMP team of its own, which then contends with the step's for
        # the cores for as long as the process runs.
        self._executor = ThreadPoolExecutor(
            prefetch_workers, thread_name_prefix="slab-prefetch",
            initializer=torch.set_num_threads, initargs=(1,),
        )  # fmt: skip

    def slot_of(self, version: str) -> int | None:
        """The slot holding `version` if it is resident (fully loaded), else None."""
        with self._lock:
            return self._resident.get(version)

    def residents(self) -> dict[str, int]:
        """{version: slot} of the resident versions, least recently used first."""
        with self._lock:
            return dict(self._resident)

    def held_on_host(self) -> list[str]:
        """The versions in the host (CPU) tier, least recently used first."""
        with self._lock:
            return self._host.versions()

    def stats(self) -> SlabStats:
        """A snapshot of the counters."""
        with self._lock:
            pages_used = self._pages.pages_used
            host = self._host
            return SlabStats(
                **{name: self._counts[name] for name in COUNTED},
                host_evictions=host.evictions,
                load_seconds=self._load_seconds,
                resident=len(self._resident),
                page_rank=self.page_rank,
                pages=self.num_pages,
                pages_used=pages_used,
                slab_bytes=self.num_pages * self.costs.page_bytes,
                slab_used_bytes=pages_used * self.costs.page_bytes,
                host_bytes=host.max_bytes or 0,
                host_used_bytes=host.used_bytes,
                host_entries=len(host),
            )

    # -- pinning and loading -------------------------------------------------------------

    def acquire(self, version: str) -> int:
        """Pin `version` and return its slot, loading it first if needed (blocks).

        Raises SlabFull when no run of pages it needs is free or held by unpinned adapters
        only, or the load's error.
        """
        with self._lock:
            slot = self._resident.get(version)
            if slot is not None:
                self._pins[version] += 1
                self._resident.move_to_end(version)
                self._counts["slot_hits"] += 1
                return slot
            load, started = self._join_or_start(version)
            # Pin now, not after the wait: once the load lands, its pages are evictable the
            # moment the lock drops. A failed load clears these pins with its pages.
            self._pins[version] += 1
        if started:
            self._load(version, load)
        return load.result()

    def try_acquire(self, version: str) -> int | None:
        """Pin `version` and return its slot if it is resident now; else None (nothing changes)."""
        with self._lock:
            slot = self._resident.get(version)
            if slot is None:
                return None
            self._pins[version] += 1
            self._resident.move_to_end(version)
            self._counts["slot_hits"] += 1
            return slot

    def prefetch(self, version: str) -> Future[int]:
        """Start loading `version` on a background thread, without pinning it.

        The future gives the slot, or the load's error, or SlabFull if no pages can be had.
        """
        with self._lock:
            slot = self._resident.get(version)
            if slot is not None:
                self._resident.move_to_end(version)
                return _settled(result=slot)
            try:
                load, started = self._join_or_start(version)
            except SlabFull as exc:
                return _settled(error=exc)
            if started:
                self._executor.submit(self._load, version, load)
        return load

    def release(self, version: str) -> None:
        """Drop one pin of `version`; a ValueError if it holds none."""
        with self._lock:
            if version not in self._resident or self._pins[version] == 0:
                raise ValueError(f"release({version!r}): it is not pinned; acquire it first")
            self._pins[version] -= 1
            # Used until now, so it is the most recently used.
            self._resident.move_to_end(version)

    def close(self) -> None:
        """Refuse new loads and wait for the background ones to settle (queued ones fail)."""
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=True)


def _settled(*, result: int | None = None, error: BaseException | None = None) -> Future[int]:
    """A future that is already done, with `result` or `error`."""
    done: Future[int] = Future()
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
    return done
