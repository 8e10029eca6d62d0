"""What 32 adapters against base-only depends on: the adapters' bytes beside the model's (CPU).

    python -m bench.engine --share

A decode step reads every linear's weights and every resident adapter's A and B once. The
tiny model's weights fit the last-level cache; with 32 rank-8 adapters beside them they do
not, and each step reads part of both from memory. The rows vary the adapters' share of the step's bytes:
more adapters on the tiny model, and 32 on the medium one (whose weights never fit). The
first line gives the host's floor for one small torch call, which a decode step's LoRA path
pays about 24 times a layer whatever the adapters' bytes.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from bench.engine_runs import side_by_side, tok_s, workload
from bench.peers.tiny_world import build
from bench.timing import median_seconds

SHAPES = {
    "tiny (hidden 256)": ({}, (0, 4, 16, 32)),
    "medium (hidden 768)": (
        {"hidden": 768, "layers": 12, "heads": 12, "kv_heads": 4, "vocab": 8192},
        (0, 32),
    ),
}


def share_rows(tmp: Path, num_prompts: int = 32, rounds: int = 5, quick: bool = False) -> list[str]:
    """tok/s of each adapter count against base-only, the counts' runs taken in turns
    (quick: the tiny model's 0 and 4 adapters, one round)."""
    shapes = {"tiny (hidden 256)": ({}, (0, 4))} if quick else SHAPES
    rounds = 1 if quick else rounds

    lines = [
        f"last-level cache: {_llc()}; one small torch call: {_call_floor_us():.1f} us; "
        f"{num_prompts} prompts, rank 8, median of {rounds} rounds",
        "",
        "| model | step's weights MB | adapters | adapters MB | adapters / weights | tok/s "
        "| vs base-only |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, (shape, counts) in shapes.items():
        world = build(tmp / f"share-{label[:4]}", rank=8, num_adapters=max(counts), **shape)
        names = sorted(world["adapters"])
        weights = linear_bytes(world["model"] / "model.safetensors")
        per_adapter = linear_bytes(world["adapters"][names[0]] / "adapter_model.safetensors")
        workloads = {count: workload(num_prompts, names[:count]) for count in counts}
        measured = side_by_side(world, workloads, repeats=rounds, hf_peer=False)
        speed = {count: tok_s(ours) for count, (ours, _) in measured.items()}
        for count in counts:
            mb = count * per_adapter / 1e6
            lines.append(
                f"| {label} | {weights / 1e6:.1f} | {count} | {mb:.1f} | {mb / (weights / 1e6):.2f} "
                f"| {speed[count]:.0f} | {speed[count] / speed[0]:.2f}x |"
            )
    return lines


_ITEM_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1}  # safetensors' dtype names


def linear_bytes(path: Path) -> int:
    """Bytes of the 2-D tensors a decode step reads whole: every linear and the LM head, not
    the embedding (a step gathers only its tokens' rows)."""
    total = 0
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 (a safetensors file is not iterable)
            t = f.get_slice(name)
            shape = t.get_shape()
            if len(shape) == 2 and "embed_tokens" not in name:
                total += shape[0] * shape[1] * _ITEM_BYTES[t.get_dtype()]
    return total


def _call_floor_us() -> float:
    """The host's cost of one torch call on a tensor too small to matter (an 8-element add):
    what each of a decode step's small LoRA calls pays before it moves a byte."""
    small = torch.zeros(8)
    with torch.inference_mode():
        return median_seconds(lambda: small.add(1.0), min_time=0.2) * 1e6


def _llc() -> str:
    caches = sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"))
    return caches[-1].read_text().strip() if caches else "unknown"
