"""The slab's host tier: an LRU of loaded adapters in CPU memory, keyed by version.

A version evicted from the device pages is refilled from here without asking the
registry again. The tier is bounded in bytes (an adapter counts every tensor it holds,
`Adapter.tensor_bytes`) and optionally in entries; the least recently used go until both
bounds hold. An adapter larger than the whole byte budget is served but never cached.
Only adapters that fit the slab are admitted (`check_fits`), so a bad upload fails on its
first load and is never cached. On CUDA the tensors are pinned (page-locked) so the
host-to-device copies that refill the slab run at full bus speed.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from adapters.errors import AdapterError
from adapters.format.adapter import Adapter
from adapters.format.base_model import BaseModelSpec
from adapters.format.tensor_names import OUTER_LAYER
from adapters.format.trainable_tokens import TrainableTokens
from adapters.registry.names import DIGEST_RE, version_digest


class HostCache:
    """Adapters within `capacity` entries and `max_bytes` of tensors (None: no such bound;
    0: nothing cached), LRU out; misses go through `loader` (the registry)."""

    def __init__(
        self,
        capacity: int | None,
        loader: Callable[[str], Adapter],
        check: Callable[[str, Adapter], None],
        *,
        lock: threading.Lock,
        pin: bool = False,
        max_bytes: int | None = None,
    ) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"max_cpu_loras must be >= 0, got {capacity}")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"the host tier's byte budget must be >= 0, got {max_bytes}")
        self.capacity, self.max_bytes, self.pin = capacity, max_bytes, pin
        self.evictions = 0
        self.used_bytes = 0  # the tensor bytes of the cached adapters
        self._loader, self._check = loader, check
        self._lock = lock  # the slab's: it guards _entries and the counters
        self._entries: OrderedDict[str, tuple[Adapter, int]] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._entries)

    def fetch(self, version: str) -> tuple[Adapter, str]:
        """(adapter, "host") on a hit, else (adapter, "registry") after loading and caching it.

        Call it without holding the lock: the loader may be slow and pinning copies.
        """
        with self._lock:
            entry = self._entries.get(version)
            if entry is not None:
                self._entries.move_to_end(version)
                return entry[0], "host"
        adapter = self._loader(version)
        self._check(version, adapter)
        size = adapter.tensor_bytes
        if not self._admits(size):
            return adapter, "registry"  # served from the loader's copy, never cached
        adapter = self._pinned(adapter)
        with self._lock:
            self._put(version, adapter, size)
        return adapter, "registry"

    def versions(self) -> list[str]:
        """The cached versions, least recently used first; call it holding the lock."""
        return list(self._entries)

    def _admits(self, size: int) -> bool:
        """Whether an adapter of `size` bytes can be cached at all, alone in the tier."""
        return self.capacity != 0 and (self.max_bytes is None or size <= self.max_bytes)

    def _put(self, version: str, adapter: Adapter, size: int) -> None:
        """Cache `adapter` as the most recent and drop the LRU ones until both bounds hold."""
        old = self._entries.pop(version, None)  # two threads may have loaded the same version
        if old is not None:
            self.used_bytes -= old[1]
        self._entries[version] = (adapter, size)
        self.used_bytes += size
        # The newest entry fits both bounds alone (_admits), so it is never the one dropped.
        while self._over():
            _, (_, dropped) = self._entries.popitem(last=False)
            self.used_bytes -= dropped
            self.evictions += 1

    def _over(self) -> bool:
        over_count = self.capacity is not None and len(self._entries) > self.capacity
        return over_count or (self.max_bytes is not None and self.used_bytes > self.max_bytes)

    def _pinned(self, adapter: Adapter) -> Adapter:
        """The adapter with its tensors in pinned memory when `pin` is set."""
        if not self.pin:
            return adapter
        modules = {
            key: dataclasses.replace(
                m,
                a=m.a.pin_memory(),
                b=m.b.pin_memory(),
                bias=_pinned(m.bias),
                magnitude=_pinned(m.magnitude),
            )
            for key, m in adapter.modules.items()
        }
        tokens = adapter.tokens
        if tokens is not None:
            tokens = TrainableTokens(tokens.ids.pin_memory(), tokens.rows.pin_memory())
        # The tensors were views over the file's bytes: with pinned copies of them, keeping
        # the file too would hold the adapter twice (tensor_bytes counts the copies).
        return dataclasses.replace(adapter, modules=modules, tokens=tokens, weights_bytes=b"")


def check_fits(
    version: str,
    adapter: Adapter,
    spec: BaseModelSpec,
    modules: Sequence[str],
    max_rank: int,
    outer: Sequence[str] = (),
) -> None:
    """AdapterError unless `adapter` is `version` and fits max_rank, the modules and the shapes."""
    where = f"adapter {version}"
    digest = version_digest(version)
    if DIGEST_RE.match(digest) and digest != adapter.digest:
        raise AdapterError(f"{where}: the loader returned a different digest, {adapter.digest}")
    r = adapter.rank
    if r > max_rank:
        raise AdapterError(f"{where}: rank {r} is above the slab's max_rank {max_rank}")
    for (layer, module), mod in adapter.modules.items():
        if layer == OUTER_LAYER:
            if module not in outer:
                raise AdapterError(
                    f"{where}: targets {module}, which this server serves no LoRA on; "
                    "set lora.embeddings: true to serve it"
                )
            fan_in, fan_out = spec.outer_shapes[module]
        else:
            if module not in modules:
                raise AdapterError(
                    f"{where}: targets {module!r}; the slab holds {', '.join(modules)}"
                )
            if not 0 <= layer < spec.num_layers:
                raise AdapterError(
                    f"{where}: layer {layer} is out of range; the base model has {spec.num_layers}"
                )
            fan_in, fan_out = spec.shapes[module]
        rm = mod.a.shape[0]  # the module's own rank (rank_pattern), at most the adapter's
        if rm > r or tuple(mod.a.shape) != (rm, fan_in) or tuple(mod.b.shape) != (fan_out, rm):
            raise AdapterError(
                f"{where}: layer {layer} {module}: lora_A {tuple(mod.a.shape)}, lora_B "
                f"{tuple(mod.b.shape)} do not fit [r, {fan_in}] and [{fan_out}, r], r <= {r}"
            )


def _pinned(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.pin_memory()
