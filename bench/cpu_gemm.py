"""The model's CPU linear: plain torch (MKL, re-blocking the weight per call) against the weight
prepacked once for oneDNN (kernels.cpu_gemm), side by side, float32.

    python -m bench.cpu_gemm [--quick]
    python -m bench.cpu_gemm --buckets    # packed calls at their exact row count against ROW_BUCKETS

Shapes are the bench models' projections (bench/engine.py): medium (hidden 768, fused q|k|v
1280, gate|up 4096, down 2048 -> 768, LM head 8192) and tiny (hidden 256).
"""

from __future__ import annotations

import argparse

import torch

from bench.timing import interleaved_seconds, machine
from kernels import pack_weight, packed_linear

SHAPES = {  # (in, out)
    "medium q,k,v": (768, 1280),
    "medium gate,up": (768, 4096),
    "medium down": (2048, 768),
    "medium LM head": (768, 8192),
    "tiny q,k,v": (256, 512),
    "tiny gate,up": (256, 1024),
}


def _exact(x, w, packed):
    """oneDNN at x's own row count: one primitive per count, the path before ROW_BUCKETS."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


# (first, second): each a column name and how it runs (x, weight, packed)
PLAIN_PACKED = (("plain", lambda x, w, p: torch.nn.functional.linear(x, w)),
                ("packed", lambda x, w, p: packed_linear(x, w, p, None)))  # fmt: skip
EXACT_BUCKETED = (("exact", _exact), ("bucketed", lambda x, w, p: packed_linear(x, w, p, None)))


def rows(quick: bool, pair=PLAIN_PACKED, counts=None) -> list[str]:
    """One table row per projection and row count: the pair's two timings, interleaved."""
    (a, run_a), (b, run_b) = pair
    counts = counts or ((1, 32) if quick else (1, 8, 32, 128, 1024))
    shapes = dict(list(SHAPES.items())[:2]) if quick else SHAPES
    gen = torch.Generator().manual_seed(0)
    out = [f"| projection | in -> out | rows | {a} ms | {b} ms | {a} / {b} |",
           "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for label, (fan_in, fan_out) in shapes.items():
        w = torch.randn(fan_out, fan_in, generator=gen)
        packed = pack_weight(w)
        for n in counts:
            x = torch.randn(n, fan_in, generator=gen)
            t = interleaved_seconds(
                {a: lambda x=x, w=w, p=packed: run_a(x, w, p),
                 b: lambda x=x, w=w, p=packed: run_b(x, w, p)},
                rounds=3 if quick else 5,
            )  # fmt: skip
            out.append(
                f"| {label} | {fan_in} -> {fan_out} | {n} | {t[a] * 1e3:.3f} "
                f"| {t[b] * 1e3:.3f} | {t[a] / t[b]:.2f}x |"
            )
    return out


def bucket_rows(quick: bool) -> list[str]:
    """A packed call at its exact row count (warm) against packed_linear, which pads to
    ROW_BUCKETS: what bounding oneDNN's caches costs a call."""
    counts = (5, 33) if quick else (1, 5, 33, 57, 100, 300, 1000)
    return rows(quick, EXACT_BUCKETED, counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two shapes, 1 and 32 rows")
    parser.add_argument("--buckets", action="store_true", help="exact row counts vs buckets")
    args = parser.parse_args()
    if pack_weight(torch.zeros(1, 1)) is None:
        raise SystemExit("this torch has no oneDNN: nothing to compare")
    print(f"machine: {machine()}; float32, each row's timings interleaved\n")
    print("\n".join((bucket_rows if args.buckets else rows)(args.quick)))


if __name__ == "__main__":
    main()
