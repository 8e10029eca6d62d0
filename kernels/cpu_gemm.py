"""Dense linears on the CPU over a weight prepacked once into oneDNN's blocked layout.

torch's default CPU matmul (MKL sgemm) re-blocks the weight on every call. A serving model's
weights never change, so they are reordered once at load, as vLLM's CPU backend does with
oneDNN: decode-sized batches (8-32 rows) then run 1.2-3.2x faster on 768-8192 wide
projections (python -m bench.cpu_gemm; bench/README.md). The packed copy sits beside the plain weight, which the
adapters' DoRA norms and the CUDA paths still read: twice the float32 linears' memory, on the
CPU only.

oneDNN builds (JIT-compiles) one primitive per weight and row count, about 0.6 MB each, and
caches it twice (its own primitive cache and ideep's), 1,024 entries apiece by default. A
server's row counts vary step by step, so those caches grew by hundreds of MB under load.
Calls are therefore padded to, or cut into, row counts from ROW_BUCKETS, so a weight has at
most len(ROW_BUCKETS) primitives, all built in the first moments of traffic, and both
caches are capped at CACHE_CAPACITY.
"""

from __future__ import annotations

import os

import torch

# Rows x in x out multiply-adds below which the plain matmul wins: oneDNN's fixed cost per
# call (~10 us) outweighs its faster inner loop on a single decode row of a small projection.
MIN_PACKED_MACS = 1 << 21
_BATCH_HINT = 32  # the row count oneDNN tunes its blocking for: a decode batch
# The row counts a packed call runs at: 1, 2 or 4 (a decode of a few sequences), then steps of
# 8 up to 128 and of 16 up to 256, so a call pads at most 3, 7 or 15 rows (under 12% from 8
# rows up) and stays one call, as the exact count would be; a longer prefill runs as 256-row
# calls, each one compute-bound, and a bucketed rest.
_CHUNK = 256
ROW_BUCKETS = (1, 2, 4, *range(8, 129, 8), *range(144, _CHUNK + 1, 16))
# rows (0..256) -> the bucket a call of that many rows runs at
_BUCKET_OF = [next(n for n in ROW_BUCKETS if n >= rows) for rows in range(_CHUNK + 1)]
# Entries in each of oneDNN's caches: the buckets of nine distinct weight shapes (a
# Llama's five packed projections, with room for some of a draft's; past that the least
# recently used are built again) at ~0.3 MB per entry and cache. Read by oneDNN
# at its first primitive, so set here, before any; a value set by the operator wins.
CACHE_CAPACITY = 256
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(CACHE_CAPACITY))  # oneDNN's
os.environ.setdefault("LRU_CACHE_CAPACITY", str(CACHE_CAPACITY))  # ideep's, in front of it

_shapes: set[tuple[int, int, int, bool]] = set()  # (out, in, rows, bias) run packed so far


def packed_shapes() -> int:
    """How many (weight shape, row count) primitives the packed calls have needed so far."""
    return len(_shapes)


def row_pieces(rows: int) -> list[int]:
    """The row counts, each in ROW_BUCKETS, of the calls that cover rows (padded as above)."""
    chunks, rest = divmod(rows, _CHUNK)
    return [_CHUNK] * chunks + ([_BUCKET_OF[rest]] if rest else [])


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """weight [out, in] reordered for packed_linear, or None where it does not apply (not a
    float32 CPU tensor, or a torch built without oneDNN)."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.dim() != 2:
        return None
    if not torch.backends.mkldnn.is_available():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _BATCH_HINT)


def packed_linear(
    x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """y = x @ weight.T (+ bias), through packed (pack_weight(weight)) where it pays.

    x: [..., in] float32 on the CPU; weight: [out, in], the plain copy used for small calls.
    """
    out_f, in_f = weight.shape
    rows = x.numel() // max(in_f, 1)
    if rows * out_f * in_f < MIN_PACKED_MACS:
        return torch.nn.functional.linear(x, weight, bias)
    if rows <= _CHUNK:  # one call, as at the exact count: the common case, kept lean
        n = _BUCKET_OF[rows]
        _shapes.add((out_f, in_f, n, bias is not None))
        if n == rows:
            return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
        x2 = torch.nn.functional.pad(x.reshape(rows, in_f), (0, 0, 0, n - rows))  # [n, in]
        y = torch.ops.mkldnn._linear_pointwise(x2, packed, bias, "none", [], "")
        return y[:rows].reshape(*x.shape[:-1], out_f)
    pieces = row_pieces(rows)
    x2 = x.reshape(rows, in_f)  # [rows, in]
    padded = sum(pieces)
    if padded != rows:  # zero rows: their outputs are dropped below
        x2 = torch.nn.functional.pad(x2, (0, 0, 0, padded - rows))
    outs, start = [], 0
    for n in pieces:
        _shapes.add((out_f, in_f, n, bias is not None))
        outs.append(torch.ops.mkldnn._linear_pointwise(x2[start : start + n], packed, bias,
                                                       "none", [], ""))  # fmt: skip
        start += n
    return torch.cat(outs)[:rows].reshape(*x.shape[:-1], out_f)  # [rows, out], then x's dims
