"""A config.json's RoPE settings: its base, and how its frequencies are stretched (computed in
serving.model.rope). Both layouts are read: transformers 4's top-level `rope_theta` and
`rope_scaling` (`{"type" or "rope_type", "factor", ...}`), and transformers 5's one
`rope_parameters` dict that also holds `rope_theta` and `rope_type`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from serving.model.errors import ModelLoadError

SUPPORTED_ROPE_TYPES = ("linear", "dynamic", "llama3", "yarn")
_DEFAULT_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class RopeScaling:
    """How RoPE frequencies are stretched past the pretraining context (computed in rope.py)."""

    type: str  # one of SUPPORTED_ROPE_TYPES
    factor: float
    low_freq_factor: float | None = None  # llama3
    high_freq_factor: float | None = None  # llama3
    original_max_position_embeddings: int | None = None  # llama3, yarn
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn: round the correction range to whole dimensions
    attention_factor: float = 1.0  # multiplies cos and sin; only yarn sets it


def parse_rope(raw: dict[str, Any], max_pos: int, where: str) -> tuple[float, RopeScaling | None]:
    params = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        raise ModelLoadError(f"{where}: RoPE parameters {params!r} are not one flat object")
    theta = float(params.get("rope_theta", raw.get("rope_theta", _DEFAULT_ROPE_THETA)))
    rtype = params.get("rope_type", params.get("type", "default"))
    if rtype == "default":
        return theta, None
    if rtype not in SUPPORTED_ROPE_TYPES:
        supported = ", ".join(SUPPORTED_ROPE_TYPES)
        raise ModelLoadError(
            f"{where}: RoPE scaling {rtype!r} is not supported; supported: {supported}"
        )
    # a top-level original_max_position_embeddings wins, as in transformers
    original = raw.get("original_max_position_embeddings") or params.get(
        "original_max_position_embeddings", max_pos
    )
    try:
        if rtype in ("linear", "dynamic"):
            return theta, RopeScaling(rtype, float(params["factor"]))
        if rtype == "llama3":
            low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
            return theta, RopeScaling(rtype, float(params["factor"]), low, high, int(original))
        return theta, _yarn(params, max_pos, int(original))
    except KeyError as exc:
        raise ModelLoadError(f"{where}: RoPE scaling {rtype!r} needs {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{where}: bad RoPE scaling {params!r}: {exc}") from None


def _yarn(params: dict[str, Any], max_pos: int, original: int) -> RopeScaling:
    factor = params.get("factor")
    factor = float(factor) if factor is not None else max_pos / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return RopeScaling(
        "yarn",
        factor,
        original_max_position_embeddings=original,
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        truncate=bool(params.get("truncate", True)),
        attention_factor=float(attention),
    )
