"""Adapter loads on CPU: registry -> slab (cold), host tier -> slab, and an eviction, each
against a raw read of the same bytes, for an 8B-shaped rank-16 adapter on every linear
(about 84 MB in bf16).

    python -m bench.adapters

Cold: a one-slot slab with no host tier alternates two versions, so every acquire
evicts and loads from the registry (read, check structure, copy into the slot); the
verified row also re-hashes the files and re-scans the values, as publish does. Raw: reading the
version's adapter_model.safetensors from the same registry folder. Host hit: the same slab
with a two-adapter host tier, so every acquire evicts and copies from host memory into the
slot. Of each host hit, the copy is the load's own time (SlabStats.load_seconds) and the
eviction the rest of the acquire: claiming the slot from its least recently used version.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from functools import partial

import torch
from safetensors.torch import save

from adapters.format.adapter import parse_adapter
from adapters.format.base_model import BaseModelSpec, module_group
from adapters.registry.registry import Registry
from adapters.slab.slab import AdapterSlab
from bench.timing import interleaved_seconds, machine

LLAMA_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}
RANK = 16


def adapter_files(spec: BaseModelSpec, seed: int) -> dict[str, bytes]:
    """PEFT's files for a random rank-16 bf16 LoRA on every linear of every layer."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(spec.num_layers):
        for module, (fan_in, fan_out) in spec.shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.{module_group(module)}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (
                torch.randn(RANK, fan_in, generator=gen) / 64
            ).bfloat16()
            tensors[f"{prefix}.lora_B.weight"] = (
                torch.randn(fan_out, RANK, generator=gen) / 64
            ).bfloat16()
    config = {"peft_type": "LORA", "r": RANK, "lora_alpha": 32, "target_modules": list(spec.shapes)}
    return {
        "adapter_config.json": json.dumps(config).encode(),
        "adapter_model.safetensors": save(tensors),
    }


def loadavg() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    spec = BaseModelSpec.from_config(LLAMA_8B)
    with tempfile.TemporaryDirectory() as root:
        registry = Registry(f"file://{root}/registry")
        refs = []
        for seed in (1, 2):
            adapter = parse_adapter(adapter_files(spec, seed), base=spec)
            refs.append(registry.publish(f"tenant-{seed}", adapter).ref)
        weights = f"{root}/registry/versions/{refs[0].split('@')[1]}/adapter_model.safetensors"
        num_bytes = adapter.num_bytes
        kw = {"num_slots": 1, "max_rank": RANK, "dtype": torch.bfloat16}
        trusted = partial(registry.load, verify=False)  # what a replica runs
        cold = AdapterSlab(spec, max_cpu_loras=0, loader=trusted, **kw)
        verified = AdapterSlab(spec, max_cpu_loras=0, loader=registry.load, **kw)
        warm = AdapterSlab(spec, max_cpu_loras=2, loader=trusted, **kw)
        for version in refs:  # both in the host tier before any timing
            warm.acquire(version)
            warm.release(version)
        turn = {"cold": 0, "warm": 0, "verified": 0}
        host_hits: list[tuple[float, float]] = []  # (acquire's seconds, its load's seconds)

        def swap(slab, key):
            version = refs[turn[key] % 2]
            turn[key] += 1
            slab.acquire(version)
            slab.release(version)

        def host_hit():
            before = warm.stats()
            t0 = time.perf_counter()
            swap(warm, "warm")
            seconds = time.perf_counter() - t0
            after = warm.stats()
            if (after.host_hits - before.host_hits, after.evictions - before.evictions) != (1, 1):
                raise RuntimeError(f"a host hit should load from the host tier and evict once: "
                                   f"{before} -> {after}")  # fmt: skip
            host_hits.append((seconds, after.load_seconds - before.load_seconds))

        def raw():
            with open(weights, "rb") as f:
                f.read()

        s = interleaved_seconds(
            {
                "raw": raw,
                "cold": lambda: swap(cold, "cold"),
                "verified": lambda: swap(verified, "verified"),
                "host": host_hit,
            },
            rounds=3,
        )
        for slab in (cold, verified, warm):
            slab.close()
    # Of every host hit timed (warm-ups too: each one is a full hit), the load's own seconds
    # and the rest of the acquire, which frees the slot.
    s["copy"] = statistics.median(load for _, load in host_hits)
    s["evict"] = statistics.median(total - load for total, load in host_hits)
    mb = num_bytes / 1e6
    print(f"machine: {machine()}; adapter {mb:.1f} MB (rank {RANK}, 32 layers x 7 linears, bf16)\n")
    print("| path | ms | MB/s | vs raw read | target |")
    print("|---|---:|---:|---:|---|")
    print(
        f"| raw read of the safetensors file | {s['raw'] * 1e3:.1f} | {mb / s['raw']:.0f} | 1.00x | |"
    )
    print(
        f"| cold load, registry -> slab (a replica: trusts the published version) "
        f"| {s['cold'] * 1e3:.1f} | {mb / s['cold']:.0f} | {s['raw'] / s['cold']:.2f}x | >= 0.5x |"
    )
    print(
        f"| cold load, verified (sha256 + value scan again) | {s['verified'] * 1e3:.1f} "
        f"| {mb / s['verified']:.0f} | {s['raw'] / s['verified']:.2f}x | |"
    )
    print(
        f"| host-tier hit -> slab (acquire: an eviction and the copy) | {s['host'] * 1e3:.1f} "
        f"| {mb / s['host']:.0f} | {s['raw'] / s['host']:.2f}x | <= 50 ms |"
    )
    print(
        f"| host -> slab copy (the load alone) | {s['copy'] * 1e3:.1f} "
        f"| {mb / s['copy']:.0f} | {s['raw'] / s['copy']:.2f}x | |"
    )
    print(
        f"| eviction (the acquire's time outside its load) | {s['evict'] * 1e3:.3f} "
        f"| | {s['raw'] / s['evict']:.0f}x | |"
    )
    print(f"\n{len(host_hits)} host hits timed; load average (1 / 5 / 15 min): {loadavg()}")


if __name__ == "__main__":
    main()
