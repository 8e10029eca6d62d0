"""Launch configurations of the Triton LoRA kernels: measured per GPU model, else defaults.

`bench/gpu_lora_tune.py` times candidate configurations on a GPU and writes the fastest,
per op and per bucket of the step's token count, to kernels/tuned/<GPU name>.json. A
launch reads the file named for the GPU it runs on; a GPU without one, a bucket the file
leaves out, and the CPU's interpreter get the defaults below.

LORASERVE_LORA_CONFIGS=<path> names another file (the tuner uses it to try its result).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

import torch

TUNED_DIR = Path(__file__).parent / "tuned"
# Upper bounds of a step's token count: decode batches (graphs pad to 1-64 rows), a short
# prefill, then anything longer ("large").
TOKEN_BUCKETS = (16, 64, 256)


@dataclass(frozen=True)
class ShrinkConfig:
    """x [T, hidden] @ A.T per segment: hidden streamed BLOCK_K at a time; the grid split
    along hidden until it holds programs_per_sm programs per multiprocessor."""

    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int = 4
    block_m: int = 64

    def __post_init__(self):
        _check(
            self,
            {"num_stages": self.num_stages, "programs_per_sm": self.programs_per_sm},
            {"block_k": self.block_k, "block_m": self.block_m},
        )


@dataclass(frozen=True)
class ExpandConfig:
    """t [T, rank] @ B per segment: n_chunks blocks of BLOCK_N output columns per program."""

    block_n: int = 128
    num_warps: int = 4
    num_stages: int = 3
    n_chunks: int = 1
    block_m: int = 64

    def __post_init__(self):
        _check(
            self,
            {"num_stages": self.num_stages, "n_chunks": self.n_chunks},
            {"block_n": self.block_n, "block_m": self.block_m},
        )


def _check(config, counts: dict[str, int], blocks: dict[str, int]) -> None:
    """Tiles Triton can build: power-of-two blocks of 16 or more, 1-16 warps, counts of 1 or
    more."""
    every = {**blocks, **counts, "num_warps": config.num_warps}
    not_ints = [f"{k}={v!r}" for k, v in every.items() if type(v) is not int]
    if not_ints:
        raise ValueError(f"{type(config).__name__}: not whole numbers: {', '.join(not_ints)}")
    bad = [f"{k}={v}" for k, v in blocks.items() if v < 16 or v & (v - 1)]
    bad += [f"{k}={v}" for k, v in counts.items() if v < 1]
    if config.num_warps not in (1, 2, 4, 8, 16):
        bad.append(f"num_warps={config.num_warps}")
    if bad:
        raise ValueError(f"{type(config).__name__}: invalid {', '.join(bad)}")


def rows_per_program(max_segment_len: int, cap: int) -> int:
    """BLOCK_M: tokens of one segment per program, 16-64 by the longest segment, at most cap.

    CUDA graphs size the grid for the longest segment a batch could hold (all of it), so a
    decode batch of one token per adapter still gets 32- or 64-row tiles unless the cap is
    lower; tiles that size carry [BLOCK_M, BLOCK_N] pointers and masks for one live row."""
    rows = 16 if max_segment_len <= 16 else 32 if max_segment_len <= 32 else 64
    return min(rows, cap)


def bucket(num_tokens: int) -> str:
    """The token-count bucket a step falls in: "16", "64", "256" or "large"."""
    for bound in TOKEN_BUCKETS:
        if num_tokens <= bound:
            return str(bound)
    return "large"


def shrink_config(device: torch.device, num_tokens: int) -> ShrinkConfig:
    return _lookup(device, "shrink", num_tokens)


def expand_config(device: torch.device, num_tokens: int) -> ExpandConfig:
    return _lookup(device, "expand", num_tokens)


def file_for(device_name: str) -> Path:
    """Where the tuned table of a GPU model lives: "NVIDIA H200" -> tuned/NVIDIA_H200.json."""
    return TUNED_DIR / (re.sub(r"[^A-Za-z0-9.-]+", "_", device_name).strip("_") + ".json")


def table_path(index: int | None = None) -> tuple[Path, bool]:
    """The table GPU `index` reads, and whether LORASERVE_LORA_CONFIGS named it."""
    override = os.environ.get("LORASERVE_LORA_CONFIGS")
    if override:
        return Path(override), True  # the GPU is not asked: the named file serves every one
    return file_for(torch.cuda.get_device_name(index)), False


def _lookup(device: torch.device, op: str, num_tokens: int):
    # Once per launch: the defaults are built once, not per call (frozen, so shared).
    if device.type != "cuda":
        return _DEFAULTS[op]
    index = torch.cuda.current_device() if device.index is None else device.index
    return _table(index).get(op, {}).get(bucket(num_tokens), _DEFAULTS[op])


@cache
def _table(index: int) -> dict[str, dict[str, object]]:
    """{op: {bucket: config}} for GPU `index`; empty when the GPU has no file. A file named
    by LORASERVE_LORA_CONFIGS must exist."""
    path, override = table_path(index)
    if not path.is_file():
        if override:
            raise ValueError(f"LORASERVE_LORA_CONFIGS: {path} is not a file")
        return {}
    try:
        raw = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected an object of ops")
    kinds = {"shrink": ShrinkConfig, "expand": ExpandConfig}
    table: dict[str, dict[str, object]] = {}
    for op, by_bucket in raw.items():
        if op == "measured":
            continue  # the tuner's measurements, kept beside the configs
        if op not in kinds or not isinstance(by_bucket, dict):
            raise ValueError(f"{path}: {op!r}: expected shrink, expand or measured, each an "
                             "object of buckets")  # fmt: skip
        names = {f.name for f in fields(kinds[op])}
        for key, values in by_bucket.items():
            if not isinstance(values, dict):
                raise ValueError(f"{path}: {op}[{key}]: expected an object of fields")
            unknown = set(values) - names
            if unknown or key not in (*map(str, TOKEN_BUCKETS), "large"):
                raise ValueError(f"{path}: {op}[{key}]: unknown bucket or fields {sorted(unknown)}")
            try:
                table.setdefault(op, {})[key] = kinds[op](**values)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path}: {op}[{key}]: {exc}") from None
    return table


_DEFAULTS = {"shrink": ShrinkConfig(), "expand": ExpandConfig()}


def clear_cache() -> None:
    """Forget the tables read so far (after a new file is written)."""
    _table.cache_clear()
