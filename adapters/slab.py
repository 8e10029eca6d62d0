"""The adapter slab: one model replica's device-resident LoRA weights, one slot per adapter.

For every layer and targetable module the slab holds the stacks the LoRA kernels read
(kernels/lora_ops.py), preallocated once, with a scale and a rank per slot (0: an empty
slot); lora_B biases and DoRA's output scales beside them, and trainable tokens, up to
`max_tokens` per slot: what a slot holds, and how it is filled and emptied, is
adapters/slab_slots.py. With `embeddings`, the embedding's and the LM head's stacks are
kept too, under layer -1.

Adapters move registry (the `loader`) -> host tier (an LRU in CPU memory) -> a slot.
`acquire` pins a version in a slot for as long as a request uses it and `release` unpins
it; only unpinned slots are evicted, least recently used first. One lock guards the
bookkeeping; registry fetches and tensor copies run outside it, into a slot reserved for
that load, which no reader touches until the load marks it resident.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import torch

from adapters.base_model import BaseModelSpec
from adapters.format import Adapter
from adapters.host_cache import HostCache, check_fits
from adapters.slab_slots import SlotContents
from adapters.slab_stats import COUNTED, SlabFull, SlabStats
from adapters.slab_vectors import BaseWeight

log = logging.getLogger("loraserve.adapters")


class AdapterSlab:
    """Fixed device slots of LoRA weights for one model replica, filled on demand."""

    def __init__(
        self,
        spec: BaseModelSpec,
        *,
        num_slots: int,
        max_rank: int,
        max_cpu_loras: int,
        loader: Callable[[str], Adapter],
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        modules: Sequence[str] | None = None,
        prefetch_workers: int = 2,
        base_weight: BaseWeight | None = None,
        embeddings: bool = False,
        max_tokens: int = 64,
    ) -> None:
        if num_slots < 1 or max_rank < 1:
            raise ValueError(f"num_slots and max_rank must be >= 1, got {num_slots}, {max_rank}")
        self.spec, self.num_slots, self.max_rank, self.dtype = spec, num_slots, max_rank, dtype
        self.device = torch.device(device)
        self.modules = tuple(spec.shapes if modules is None else modules)
        unknown = sorted(set(self.modules) - set(spec.shapes))
        if unknown:
            raise ValueError(f"modules {unknown} are not in the base model ({list(spec.shapes)})")
        # The embedding's and LM head's stacks are vocabulary-wide: only when asked for.
        self.outer = tuple(spec.outer_shapes) if embeddings else ()
        # Not inference tensors (a caller's inference_mode): loader threads write them in place.
        with torch.inference_mode(False):
            self.contents = SlotContents(
                spec, self.modules, self.outer, num_slots=num_slots, max_rank=max_rank,
                max_tokens=max_tokens, base_weight=base_weight, dtype=dtype, device=self.device,
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
        self._host = HostCache(max_cpu_loras, loader, check, lock=self._lock, pin=pin)
        self._slot_version: list[str | None] = [None] * num_slots  # resident or loading
        self._pins = [0] * num_slots
        self._resident: OrderedDict[str, int] = OrderedDict()  # version -> slot, LRU first
        self._loading: dict[str, tuple[int, Future[int]]] = {}  # version -> (slot, its load)
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

    # -- what the model runtime reads ---------------------------------------------------

    def lora_a(self, layer: int, module: str) -> torch.Tensor:
        """The A stack of (layer, module): [num_slots, max_rank, in]."""
        return self.stacks.a[layer, module]

    def lora_b(self, layer: int, module: str) -> torch.Tensor:
        """The B stack of (layer, module), B transposed per slot: [num_slots, max_rank, out]."""
        return self.stacks.b[layer, module]

    def serves_outer(self, module: str) -> bool:
        """Whether some slot's adapter has LoRA on module: a step skips its LoRA if none."""
        return self.stacks.ranks.serves_outer(module)

    def module_ranks(self, layer: int, modules: Sequence[str]) -> torch.Tensor:
        """Each module's own rank per slot, [len(modules), num_slots] (kernels' slice_ranks)."""
        return self.stacks.ranks.of(layer, modules)

    def module_host_ranks(self, layer: int, modules: Sequence[str]) -> list[list[int]]:
        """module_ranks as lists, read with no device sync."""
        return self.stacks.ranks.host_of(layer, modules)

    def lora_bias(self, layer: int, module: str) -> torch.Tensor:
        """scale * lora_B's bias per slot for (layer, module): [num_slots, out]."""
        return self.vectors.bias[layer, module]

    def lora_dora(self, layer: int, module: str) -> torch.Tensor:
        """DoRA's output scale per slot for (layer, module): [num_slots, out] (1: none)."""
        return self.vectors.dora[layer, module]

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
            return SlabStats(
                **{name: self._counts[name] for name in COUNTED},
                host_evictions=self._host.evictions,
                load_seconds=self._load_seconds,
                resident=len(self._resident),
            )

    # -- pinning and loading -------------------------------------------------------------

    def acquire(self, version: str) -> int:
        """Pin `version` in a slot and return the slot, loading it first if needed (blocks).

        Raises SlabFull when every slot is pinned or loading, or the load's error.
        """
        with self._lock:
            slot = self._resident.get(version)
            if slot is not None:
                self._pins[slot] += 1
                self._resident.move_to_end(version)
                self._counts["slot_hits"] += 1
                return slot
            slot, load, started = self._join_or_start(version)
            # Pin now, not after the wait: once the load lands, the slot is evictable the
            # moment the lock drops. A failed load clears these pins with the slot.
            self._pins[slot] += 1
        if started:
            self._load(version, slot, load)
        return load.result()

    def try_acquire(self, version: str) -> int | None:
        """Pin `version` and return its slot if it is resident now; else None (nothing changes)."""
        with self._lock:
            slot = self._resident.get(version)
            if slot is None:
                return None
            self._pins[slot] += 1
            self._resident.move_to_end(version)
            self._counts["slot_hits"] += 1
            return slot

    def prefetch(self, version: str) -> Future[int]:
        """Start loading `version` on a background thread, without pinning it.

        The future gives the slot, or the load's error, or SlabFull if no slot is free.
        """
        with self._lock:
            slot = self._resident.get(version)
            if slot is not None:
                self._resident.move_to_end(version)
                return _settled(result=slot)
            try:
                slot, load, started = self._join_or_start(version)
            except SlabFull as exc:
                return _settled(error=exc)
            if started:
                self._executor.submit(self._load, version, slot, load)
        return load

    def release(self, version: str) -> None:
        """Drop one pin of `version`; a ValueError if it holds none."""
        with self._lock:
            slot = self._resident.get(version)
            if slot is None or self._pins[slot] == 0:
                raise ValueError(f"release({version!r}): it is not pinned; acquire it first")
            self._pins[slot] -= 1
            # Used until now, so it is the most recently used.
            self._resident.move_to_end(version)

    def close(self) -> None:
        """Refuse new loads and wait for the background ones to settle (queued ones fail)."""
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=True)

    # -- slot bookkeeping (under the lock) -----------------------------------------------

    def _join_or_start(self, version: str) -> tuple[int, Future[int], bool]:
        """(slot, load, started): the running load of `version`, or a new one on a claimed slot."""
        if version in self._loading:
            return (*self._loading[version], False)
        if self._closed:
            raise RuntimeError(f"cannot load {version!r}: the adapter slab is closed")
        slot = self._claim_slot(version)
        load: Future[int] = Future()
        load.set_running_or_notify_cancel()  # shared by every waiter: nobody may cancel it
        self._loading[version] = (slot, load)
        return slot, load, True

    def _claim_slot(self, version: str) -> int:
        """Reserve a free slot, else evict the least recently used unpinned one."""
        slot = next((s for s, v in enumerate(self._slot_version) if v is None), None)
        if slot is None:
            slot = next((s for s in self._resident.values() if self._pins[s] == 0), None)
            if slot is None:
                raise SlabFull(
                    f"cannot load {version!r}: all {self.num_slots} adapter slots are pinned "
                    "or loading; release one first"
                )
            del self._resident[self._slot_version[slot]]
            self._counts["evictions"] += 1
            self._free(slot)
        self._slot_version[slot] = version
        return slot

    def _free(self, slot: int) -> None:
        """Mark `slot` empty: rank 0, no version, no pins."""
        self._slot_version[slot] = None
        self._pins[slot] = 0
        self.contents.clear(slot)

    # -- one load (outside the lock, into its reserved slot) -----------------------------

    def _load(self, version: str, slot: int, load: Future[int]) -> None:
        """Fill the reserved `slot` with `version`; settle `load` with the slot or the error."""
        start = time.perf_counter()
        try:
            if self._closed:
                raise RuntimeError(f"cannot load {version!r}: the adapter slab is closed")
            adapter, tier = self._host.fetch(version)
            self.contents.check(version, adapter)
            self.contents.write(slot, adapter)
            with self._lock:
                self.contents.publish(slot, adapter)
                del self._loading[version]
                self._resident[version] = slot
                self._counts["loads"] += 1
                self._counts[f"{tier}_hits"] += 1
                self._load_seconds += time.perf_counter() - start
        except BaseException as exc:  # every waiter must wake, whatever went wrong
            try:
                with self._lock:
                    self._loading.pop(version, None)
                    self._counts["failed_loads"] += 1
                    self._free(slot)
            except Exception:  # the waiters still wake, with the load's own error
                log.exception("slot %d could not be cleared after %r failed to load", slot, version)
            finally:
                load.set_exception(exc)
            return
        load.set_result(slot)


def _settled(*, result: int | None = None, error: BaseException | None = None) -> Future[int]:
    """A future that is already done, with `result` or `error`."""
    done: Future[int] = Future()
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
    return done
