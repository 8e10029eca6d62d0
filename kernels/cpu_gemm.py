"""Dense linears on the CPU over a weight prepacked once into oneDNN's blocked layout.

torch's default CPU matmul (MKL sgemm) re-blocks the weight on every call. A serving model's
weights never change, so they are reordered once at load, as vLLM's CPU backend does with
oneDNN: decode-sized batches (8-32 rows) then run 1.2-3.2x faster on 768-8192 wide
projections (python -m bench.cpu_gemm; bench/README.md). The packed copy sits beside the plain weight, which the
adapters' DoRA norms and the CUDA paths still read: twice the float32 linears' memory, on the
CPU only.
"""

from __future__ import annotations

import torch

# Rows x in x out multiply-adds below which the plain matmul wins: oneDNN's fixed cost per
# call (~10 us) outweighs its faster inner loop on a single decode row of a small projection.
MIN_PACKED_MACS = 1 << 21
_BATCH_HINT = 32  # the row count oneDNN tunes its blocking for: a decode batch


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
    rows = x.numel() // max(x.shape[-1], 1)
    if rows * weight.shape[0] * weight.shape[1] < MIN_PACKED_MACS:
        return torch.nn.functional.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
