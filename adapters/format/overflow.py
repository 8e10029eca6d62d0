"""Refuses an adapter whose LoRA delta could leave the served model's floating-point range.

For one token x, a LoRA adds to its linear's output (scale applied last, as lora_expand does)

    t = x @ A.T                 A: [r, in]     shrink
    u = t @ B.T                 B: [out, r]    expand, before the scale
    y = scale * u

With |x_i| <= X and ||M|| the largest row sum of |M| (the infinity norm), the bounds (the
first reached by an input whose signs line up with a row of A) are

    |t| <= X * ||A||      |u| <= X * ||A|| * ||B||      |y| <= X * ||A|| * ||B|| * |scale|

The rule: each of these, |scale| and every weight of B must stay at or below the largest
finite value of the model's dtype (a weight cast to the dtype must not become Inf, as
0 * Inf is NaN). ||A|| <= in * max|A| and ||B|| <= r * max|B|, so this bounds
max|B| * max|A| * scale with the fan-ins an aligned input sums over, and is never looser.

X = ACTIVATION_BOUND = 100: a LoRA reads the normed hidden state (entries of order 1) or
the attention or MLP intermediate (tens). Trained adapters sit far inside the bound (the
demo's use about a tenth of float16's range; tests/adapters/format/test_overflow.py checks them),
and PEFT's initial B is zero.
An unknown dtype is taken to be float16, the narrowest a model is served in.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from adapters.errors import AdapterError

ACTIVATION_BOUND = 100.0
FALLBACK_DTYPE = "float16"
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def dtype_limit(dtype: str | None) -> tuple[str, float]:
    """(dtype name, its largest finite value); an unknown or missing dtype counts as float16."""
    name = dtype if dtype in _DTYPES else FALLBACK_DTYPE
    return name, torch.finfo(_DTYPES[name]).max


def check_activation_bound(
    label: str,
    pairs: Iterable[tuple[str, torch.Tensor, torch.Tensor]],
    scale: float,
    dtype: str | None,
) -> None:
    """Raise AdapterError if the scale or any (where, A, B) can overflow `dtype` (rule above)."""
    name, limit = dtype_limit(dtype)
    if not abs(scale) <= limit:
        raise AdapterError(
            f"{label}: scale {scale:g} (lora_alpha / r) is beyond {name}'s range (max {limit:g})"
        )
    for where, a, b in pairs:
        norm_a, norm_b = _row_norm(a), _row_norm(b)
        largest_b = float(b.abs().max()) if b.numel() else 0.0
        worst = ACTIVATION_BOUND * norm_a * max(1.0, norm_b, norm_b * abs(scale))
        if not (worst <= limit and largest_b <= limit):
            raise AdapterError(
                f"{label}: {where}: weights too large: an input of magnitude "
                f"{ACTIVATION_BOUND:g} can give outputs up to {worst:.3g} (|scale| {abs(scale):g} "
                f"* ||B|| {norm_b:.3g} * ||A|| {norm_a:.3g}), beyond {name}'s {limit:g}"
            )


def _row_norm(t: torch.Tensor) -> float:
    """max_i sum_j |t[i, j]|, summed in float64 so the bound itself cannot round down."""
    if t.numel() == 0:
        return 0.0
    return float(torch.linalg.vector_norm(t, ord=1, dim=1, dtype=torch.float64).max())
