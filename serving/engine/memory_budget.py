"""A replica's memory for adapters, in bytes: the device slab and the host tier.

lora.slab_mb and lora.host_mb are used as given; "auto" takes a share of what the machine
has. The slab is sized after the models load and before the KV cache, which then takes its
share of what is left (engine_setup.num_kv_blocks), so on a GPU the two never overlap.
The host tier is a bound, not an allocation: it fills as adapters are loaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from adapters.format.base_model import BaseModelSpec
from serving.config import ServeConfig

# slab_mb auto on a GPU: this share of the memory free once the weights are loaded. Adapter
# pages are few next to KV blocks; more would starve the batch of KV.
SLAB_GPU_SHARE = 0.10
# slab_mb auto on a CPU: this share of the RAM available at start, at most the cap (the
# slab is allocated whole, and a laptop's demo needs a few MiB of it).
SLAB_CPU_SHARE = 0.05
SLAB_CPU_CAP_BYTES = 256 << 20
# host_mb auto: this share of the machine's memory (or of the container's limit). 1,000
# rank-8 q/v adapters of a 7B-shaped model take about 8 GB in bf16 (17 GB in float32), so
# a 64 GiB machine holds them.
HOST_SHARE = 0.25
# cgroup v2, then v1: a container's memory limit, which the machine's total may far exceed.
_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


@dataclass(frozen=True)
class AdapterMemory:
    """One model's memory for adapters: its device slab, in adapters of max_lora_rank
    (num_slots) or in bytes (slab_bytes), one of them None; and its host tier's bytes."""

    num_slots: int | None
    slab_bytes: int | None
    host_bytes: int

    def for_draft(
        self, spec: BaseModelSpec, draft: BaseModelSpec, rank: int, num_slots: int
    ) -> AdapterMemory:
        """The draft model's: a slab of num_slots adapters (as many as the target's holds),
        and a host tier scaled by how large an adapter of each model is."""
        ratio = draft.largest_adapter_bytes(rank) / spec.largest_adapter_bytes(rank)
        return AdapterMemory(num_slots, None, max(1, int(self.host_bytes * ratio)))


def adapter_memory(cfg: ServeConfig, device: str) -> AdapterMemory:
    """The target model's adapter memory; call it once the models are loaded, before the KV."""
    lora = cfg.lora
    if lora.max_loras is not None:
        slab = None  # sized in adapters
    elif lora.slab_mb != "auto":
        slab = lora.slab_mb << 20
    elif device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        slab = int(free * SLAB_GPU_SHARE)
    else:
        slab = min(int(available_ram() * SLAB_CPU_SHARE), SLAB_CPU_CAP_BYTES)
    host = lora.host_mb << 20 if lora.host_mb != "auto" else int(physical_ram() * HOST_SHARE)
    return AdapterMemory(lora.max_loras, slab, host)


def available_ram() -> int:
    """Bytes of memory available now (Linux MemAvailable), else physical pages free."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def physical_ram() -> int:
    """Bytes of memory this process may use in all: the machine's, or its container's limit."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) means none; v1 writes a huge number instead
            return min(total, int(text))
    return total
