"""The slab's host tier: an LRU of loaded adapters in CPU memory, keyed by version.

A version evicted from the device slots is refilled from here without asking the
registry again. Only adapters that fit the slab are admitted (`check_fits`), so a bad
upload fails on its first load and is never cached. On CUDA the tensors are pinned
(page-locked) so the host-to-device copies that refill a slot run at full bus speed.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from adapters.base_model import BaseModelSpec
from adapters.errors import AdapterError
from adapters.format import Adapter
from adapters.names import DIGEST_RE, version_digest
from adapters.tensor_names import OUTER_LAYER


class HostCache:
    """Up to `capacity` adapters (0: none), LRU out; misses go through `loader` (the registry)."""

    def __init__(
        self,
        capacity: int,
        loader: Callable[[str], Adapter],
        check: Callable[[str, Adapter], None],
        *,
        lock: threading.Lock,
        pin: bool = False,
    ) -> None:
        if capacity < 0:
            raise ValueError(f"max_cpu_loras must be >= 0, got {capacity}")
        self.capacity, self.pin = capacity, pin
        self.evictions = 0
        self._loader, self._check = loader, check
        self._lock = lock  # the slab's: it guards _entries and the counters
        self._entries: OrderedDict[str, Adapter] = OrderedDict()  # oldest first

    def fetch(self, version: str) -> tuple[Adapter, str]:
        """(adapter, "host") on a hit, else (adapter, "registry") after loading and caching it.

        Call it without holding the lock: the loader may be slow and pinning copies.
        """
        with self._lock:
            adapter = self._entries.get(version)
            if adapter is not None:
                self._entries.move_to_end(version)
                return adapter, "host"
        adapter = self._loader(version)
        self._check(version, adapter)
        adapter = self._pinned(adapter)
        with self._lock:
            self._put(version, adapter)
        return adapter, "registry"

    def versions(self) -> list[str]:
        """The cached versions, least recently used first; call it holding the lock."""
        return list(self._entries)

    def _put(self, version: str, adapter: Adapter) -> None:
        """Cache `adapter` as the most recent and drop the LRU ones beyond capacity."""
        if self.capacity == 0:
            return
        self._entries[version] = adapter
        self._entries.move_to_end(version)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
            self.evictions += 1

    def _pinned(self, adapter: Adapter) -> Adapter:
        """The adapter with its tensors in pinned memory when `pin` is set (and it is cached)."""
        if not self.pin or self.capacity == 0:
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
        return dataclasses.replace(adapter, modules=modules)


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
