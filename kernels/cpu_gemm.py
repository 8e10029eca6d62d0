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
Calls are therefore cut into pieces whose row counts come from ROW_BUCKETS, so a weight has
at most len(ROW_BUCKETS) primitives, all built in the first moments of traffic, and both
caches are capped at CACHE_CAPACITY.
"""

from __future__ import annotations

import os

import torch

# Rows x in x out multiply-adds below which the plain matmul wins: oneDNN's fixed cost per
# call (~10 us) outweighs its faster inner loop on a single decode row of a small projection.
MIN_PACKED_MACS = 1 << 21
_BATCH_HINT = 32  # the row count oneDNN tunes its blocking for: a decode batch
# Rows are padded up to a power of two below ROW_STEP (a decode of 1-7 sequences pays at
# most 3 rows more), else to a multiple of ROW_STEP: at most 7 rows of extra work.
ROW_STEP = 8
_SMALL = (1, 2, 4)
_TILE, _CHUNK = 64, 256
# The row counts a packed call runs at: a remainder under 64 (decode), a multiple of 64 up
# to 256, or 256 (a long prefill runs as several 256-row calls, each one compute-bound).
ROW_BUCKETS = (*_SMALL, *range(ROW_STEP, _TILE, ROW_STEP), *range(_TILE, _CHUNK + 1, _TILE))
# Entries in each of oneDNN's caches: the buckets of about a dozen distinct weight shapes
# (a model's and its draft's projections) at ~0.3 MB per entry and cache. Read by oneDNN
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
    if rows < ROW_STEP:
        return [next(n for n in (*_SMALL, ROW_STEP) if n >= rows)] if rows > 0 else []
    padded = -(-rows // ROW_STEP) * ROW_STEP
    chunks, rest = divmod(padded, _CHUNK)
    tiles = rest // _TILE * _TILE
    return [_CHUNK] * chunks + [n for n in (tiles, rest - tiles) if n]


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
    y = outs[0] if len(outs) == 1 else torch.cat(outs)  # [padded, out]
    return y[:rows].reshape(*x.shape[:-1], out_f)
