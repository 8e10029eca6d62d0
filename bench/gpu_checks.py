"""The checks bench/gpu_all.py runs: each returns table rows (check, shape, result, ratio, target, ok)."""

from __future__ import annotations

import itertools

import torch

from bench.timing import copier, interleaved_seconds, replayed
from kernels import (
    build_segments,
    fp8_block_linear,
    fp8_linear,
    lora_apply_planned,
    quantize_fp8,
    quantize_fp8_blocks,
)
from kernels.fp8 import _scaled_mm_linear, dequantize_fp8
from kernels.lora_expand_triton import lora_expand_triton
from kernels.lora_reference import expand_oracle, shrink_oracle
from kernels.lora_shrink_triton import lora_shrink_parts

RANK = 16
NUM_SLOTS = 64
SLABS, REPEATS = 8, 24  # applies per timed graph replay, cycling over the slabs


def correctness_rows(device: str, dry_run: bool):
    dtypes = (torch.float16, torch.float32) if dry_run else (torch.bfloat16, torch.float16)
    shapes = [(7, 48, 40)] if dry_run else [(64, 4096, 4096), (2048, 4096, 4096 + 2 * 1024)]
    rows = []
    for dtype in dtypes:
        for tokens, hidden, width in shapes:
            err = _lora_error(tokens, hidden, width, dtype, device)
            tol = {torch.bfloat16: 3e-2, torch.float16: 5e-3, torch.float32: 1e-5}[dtype]
            rows.append(
                (
                    f"lora vs float64 ({str(dtype)[6:]})",
                    f"T{tokens} H{hidden} out{width}, mixed ranks",
                    f"max rel err {err:.1e}",
                    "",
                    f"<= {tol:.0e}",
                    _ok(err <= tol),
                )
            )
    w = torch.randn(512, 256) / 16
    w_q, scale = quantize_fp8(w.to(device))
    for tokens in (4, 64):  # the weight-streaming kernel, then the FP8 x FP8 GEMM
        x = torch.randn(tokens, 256, device=device,
                        dtype=torch.bfloat16 if not dry_run else torch.float32)  # fmt: skip
        y = fp8_linear(x, w_q, scale).double()
        ref = x.double() @ dequantize_fp8(w_q, scale, torch.float64).T
        rel = float((y - ref).norm() / ref.norm())
        rows.append(("fp8 linear vs float64", f"{tokens}x256 @ 256x512", f"rel err {rel:.1e}",
                     "", "<= 5e-02", _ok(rel <= 5e-2)))  # fmt: skip
    return rows


def _lora_error(tokens, hidden, width, dtype, device) -> float:
    gen = torch.Generator().manual_seed(tokens + hidden)
    num_slots, max_rank = 8, 32
    ranks = torch.tensor([32, 16, 8, 4, 32, 1, 24, 16], dtype=torch.int32)
    slots = torch.randint(-1, num_slots, (tokens,), generator=gen).to(torch.int32)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    a = (torch.randn(num_slots, max_rank, hidden, generator=gen) / hidden**0.5).to(dtype)
    b = (torch.randn(num_slots, max_rank, width, generator=gen) / 4).to(dtype)
    scales = torch.rand(num_slots, generator=gen) + 0.5
    seg = build_segments(slots.to(device), ranks.to(device))
    y = torch.zeros(tokens, width, dtype=dtype, device=device)
    # A LoRA layer's CUDA path, interpreted in a dry run: the expand adds up the shrink's
    # split parts
    parts = lora_shrink_parts(x.to(device), (a.to(device),), seg)
    lora_expand_triton(parts, (b.to(device),), y, seg, scales.to(device))
    want_t = shrink_oracle(x, [a], slots, ranks)
    want = expand_oracle(
        torch.zeros(tokens, width), want_t.nan_to_num(0.0), [b], slots, ranks, scales
    )
    return float((y.cpu().double() - want).abs().max() / want.abs().max().clamp(min=1e-12))


def lora_rows(device: str, dry_run: bool):
    dtype = torch.float32 if dry_run else torch.bfloat16
    shapes = [(8, 64, 8)] if dry_run else [(64, 4096, 64), (256, 4096, 64), (2048, 4096, 64)]
    copy = copier(device, nbytes=(8 if dry_run else 1024) * 2**20)
    rows = []
    for tokens, hidden, num_adapters in shapes:
        rows += _lora_case(tokens, hidden, num_adapters, dtype, device, copy)
    return rows


def _lora_case(tokens, hidden, num_adapters, dtype, device, copy):
    copy_fn, copy_bytes = copy
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).to(device)
    # Slabs in turn, 128 MB in all: one slab's 16 MB would stay in the H200's 60 MB L2.
    slabs = [
        tuple((torch.randn(NUM_SLOTS, RANK, hidden, generator=gen) / scale).to(dtype).to(device)
              for scale in (64, 4))
        for _ in range(SLABS)
    ]  # fmt: skip
    dense = (torch.randn(hidden, 2 * RANK, generator=gen) / 64).to(dtype).to(device)
    slots = (torch.arange(tokens) % num_adapters).to(torch.int32).to(device)
    seg = build_segments(slots, torch.full((NUM_SLOTS,), RANK, dtype=torch.int32, device=device))
    y = torch.zeros(tokens, hidden, dtype=dtype, device=device)
    scales = torch.ones(NUM_SLOTS, device=device)
    turn = itertools.cycle(slabs)

    def apply():  # the serving path: checked once per step, then the two launches
        a, b = next(turn)
        lora_apply_planned(x, (a,), (b,), y, seg, scales, RANK)

    fns = {"lora": replayed(apply, REPEATS, device),
           "dense": replayed(lambda: x @ dense, REPEATS, device)}  # fmt: skip
    s = interleaved_seconds({**fns, "copy": copy_fn}, rounds=3)
    s["lora"] /= REPEATS
    s["dense"] /= REPEATS
    size = x.element_size()
    floor_bytes = 2 * tokens * hidden * size + num_adapters * 2 * RANK * hidden * size
    floor = floor_bytes / (copy_bytes / s["copy"])
    decode = tokens <= 256 and device == "cuda"  # a dry run's timings mean nothing
    shape = f"T{tokens} H{hidden} {num_adapters} adapters r{RANK}"
    return [
        (
            "lora apply / bandwidth floor",
            shape,
            f"{s['lora'] * 1e6:.0f} us (floor {floor * 1e6:.0f} us)",
            f"{s['lora'] / floor:.2f}x",
            "<= 1.5x" if decode else "(report)",
            _ok(s["lora"] <= 1.5 * floor) if decode else "-",
        ),
        (
            "lora apply / dense same FLOPs",
            shape,
            f"dense {s['dense'] * 1e6:.0f} us",
            f"{s['lora'] / s['dense']:.2f}x",
            "(report)",
            "-",
        ),
    ]


def fp8_rows(device: str, dry_run: bool):
    if dry_run:
        return []
    rows = [_fp8_case(tokens, device) for tokens in (1, 4, 32, 64, 2048)]
    rows += [_fp8_case(tokens, device, block=(128, 128)) for tokens in (1, 16, 64, 2048)]
    rows += [_small_m_case(tokens, device) for tokens in (16, 32, 64)]
    return rows + [_rowwise_case(tokens, device, kind) for kind in ("triton", "fbgemm")
                   for tokens in (32, 64, 256, 2048)]  # fmt: skip


def _small_m_case(tokens, device):
    """The weight-streaming kernel past SMALL_M against what fp8_linear runs there
    (_scaled_mm with its activation quantization): where SMALL_M should sit."""
    from kernels.fp8_small_m_triton import fp8_linear_small_m

    return _against_scaled_mm(tokens, device, "fp8 streaming kernel / _scaled_mm",
                              fp8_linear_small_m, "(report: SMALL_M)")  # fmt: skip


def _rowwise_case(tokens, device, kind):
    """A LARGE_M_PATH kernel (kind: "triton", the Triton GEMM with the activation
    quantization fused in; "fbgemm", FBGEMM GenAI's, where installed) against
    _scaled_mm_linear (separate quantizing ops, then _scaled_mm): which kernels/fp8.py uses."""
    from kernels.fp8_fbgemm import fp8_linear_fbgemm, missing
    from kernels.fp8_rowwise_triton import fp8_linear_rowwise

    check = f"fp8 {'fused-quant triton' if kind == 'triton' else 'FBGEMM rowwise'} / _scaled_mm"
    if kind == "fbgemm" and missing() is not None:
        return (check, f"T{tokens}", f"not run: {missing()}"[:160], "-", "(report)", "-")
    kernel = fp8_linear_rowwise if kind == "triton" else fp8_linear_fbgemm
    return _against_scaled_mm(tokens, device, check, kernel, f"(report: LARGE_M_PATH {kind} if < 1)")  # fmt: skip


def _against_scaled_mm(tokens, device, check, kernel, target):
    """kernel(x, w_q, scale, None) against _scaled_mm_linear, T tokens 4096 -> 12288, GPU time
    of replayed graphs, four weights in turn: one row."""
    x = torch.randn(tokens, 4096, device=device, dtype=torch.bfloat16)
    weights = itertools.cycle([quantize_fp8(torch.randn(4096 * 3, 4096, device=device) / 64)
                               for _ in range(4)])  # fmt: skip
    fns = {"kernel": lambda: kernel(x, *next(weights), None),
           "scaled_mm": lambda: _scaled_mm_linear(x, *next(weights), None)}  # fmt: skip
    s = interleaved_seconds({k: replayed(f, REPEATS, device) for k, f in fns.items()}, rounds=3)
    ratio = s["kernel"] / s["scaled_mm"]
    return (check, f"T{tokens} 4096 -> 12288",
            f"{s['kernel'] / REPEATS * 1e6:.0f} us vs {s['scaled_mm'] / REPEATS * 1e6:.0f} us",
            f"{ratio:.2f}x", target, "-")  # fmt: skip


def _fp8_case(tokens, device, block=None):
    """fp8_linear (per-row scales), or with block (bo, bi) fp8_block_linear (a published
    checkpoint's block-wise scales), against a bf16 matmul."""
    x = torch.randn(tokens, 4096, device=device, dtype=torch.bfloat16)
    # Four weights in turn: one FP8 weight (50 MB) alone would stay in the H200's 60 MB L2.
    weights = [torch.randn(4096 * 3, 4096, device=device) / 64 for _ in range(4)]
    quantized = [
        quantize_fp8(w) if block is None else quantize_fp8_blocks(w, block) for w in weights
    ]
    fp8 = itertools.cycle(quantized)

    def run():
        if block is None:
            return fp8_linear(x, *next(fp8))
        return fp8_block_linear(x, *next(fp8), block)

    bf16 = itertools.cycle([w.to(torch.bfloat16) for w in weights])
    del weights
    # The GPU's time, replayed from a graph: timed from the host, a decode-size call is
    # mostly its launch (an H200 ran this one at 83 us against 25 us of kernel).
    fns = {"fp8": run, "bf16": lambda: x @ next(bf16).T}
    s = interleaved_seconds({k: replayed(f, REPEATS, device) for k, f in fns.items()}, rounds=3)
    s = {k: v / REPEATS for k, v in s.items()}
    decode = tokens <= 32  # where the weights' bytes set the time, FP8 should halve it
    ratio = s["fp8"] / s["bf16"]
    return (
        "fp8 linear / bf16 matmul"
        if block is None
        else f"fp8 {block[0]}x{block[1]}-block linear / bf16 matmul",
        f"T{tokens} 4096 -> 12288",
        f"{s['fp8'] * 1e6:.0f} us vs {s['bf16'] * 1e6:.0f} us",
        f"{ratio:.2f}x",
        "<= 0.65x" if decode else "(report)",
        _ok(ratio <= 0.65) if decode else "-",
    )


def _ok(passed: bool) -> str:
    return "yes" if passed else "no"
