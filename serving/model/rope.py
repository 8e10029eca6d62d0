"""Rotary position embeddings (RoFormer, Su et al. 2021) as the Llama family uses them.

The layout is transformers' "rotate half": dimension i of a head pairs with i + head_dim/2
(not with i + 1, as in the paper and in Meta's original code, which permute q/k weights to
match). The frequencies follow transformers' `ROPE_INIT_FUNCTIONS` operation by operation, in
float32, so cos/sin agree with transformers bit for bit:

    inv_freq[i] = 1 / theta^(2i / head_dim)                 i < head_dim / 2
    linear:  inv_freq / factor                              (positions squeezed by factor)
    dynamic: theta grown with the sequence length past max_position_embeddings (NTK)
    llama3:  low frequencies / factor, high ones kept, a smooth ramp between (Llama 3.1)
    yarn:    a per-dimension blend of the two, and cos/sin scaled by attention_factor
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from serving.model.hf_config import ModelConfig
from serving.model.rope_config import RopeScaling


def rope_inv_freq(config: ModelConfig, seq_len: int | None = None) -> Tensor:
    """Angular speed of each rotated pair: [head_dim // 2] float32, scaled as config says.

    seq_len matters only for 'dynamic' scaling, which changes nothing up to
    max_position_embeddings (the default); past it, transformers recomputes the frequencies
    for the longest sequence in the batch, and so must the caller.
    """
    dim, base, scaling = config.head_dim, config.rope_theta, config.rope_scaling
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim  # [dim/2]
    if scaling is not None and scaling.type == "dynamic":
        max_pos = config.max_position_embeddings
        seq_len = max(seq_len or 0, max_pos)
        base = base * ((scaling.factor * seq_len / max_pos) - (scaling.factor - 1)) ** (
            dim / (dim - 2)
        )
    inv_freq = 1.0 / (base**exponents)
    if scaling is None or scaling.type == "dynamic":
        return inv_freq
    if scaling.type == "linear":
        return inv_freq / scaling.factor
    if scaling.type == "llama3":
        return _llama3(inv_freq, scaling)
    if scaling.type == "yarn":
        return _yarn(base**exponents, dim, base, scaling)
    raise ValueError(f"unknown RoPE scaling {scaling.type!r}")  # hf_config refuses it first


def rope_attention_factor(config: ModelConfig) -> float:
    """The factor on cos and sin: 1.0 except under yarn scaling."""
    return config.rope_scaling.attention_factor if config.rope_scaling else 1.0


def rope_cos_sin(
    inv_freq: Tensor, positions: Tensor, attention_factor: float = 1.0
) -> tuple[Tensor, Tensor]:
    """cos and sin of each position's angles: [T, head_dim] float32 each, halves repeated.

    inv_freq: [head_dim // 2]; positions: [T] int64 (any order, repeats allowed).
    """
    freqs = positions[:, None].float() * inv_freq[None, :].float()  # [T, D/2]
    angles = torch.cat((freqs, freqs), dim=-1)  # [T, D]
    return angles.cos() * attention_factor, angles.sin() * attention_factor


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the last dimension split in halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each head of each token by its position: x [T, H, D], cos/sin [T, D] -> [T, H, D].

    cos/sin are cast to x's dtype first, as transformers does, so bf16 results match too.
    """
    cos = cos.to(x.dtype)[:, None, :]  # [T, 1, D]
    sin = sin.to(x.dtype)[:, None, :]
    return x * cos + rotate_half(x) * sin


def _llama3(inv_freq: Tensor, scaling: RopeScaling) -> Tensor:
    factor, original = scaling.factor, scaling.original_max_position_embeddings
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    low_freq_wavelen = original / low
    high_freq_wavelen = original / high
    wavelen = 2 * math.pi / inv_freq
    # wavelength longer than the pretraining context: interpolate fully (divide by factor)
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    # between the two bounds: blend smoothly from interpolated to unchanged
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(pos_freqs: Tensor, dim: int, base: float, scaling: RopeScaling) -> Tensor:
    original = scaling.original_max_position_embeddings

    def correction_dim(num_rotations: float) -> float:
        # the dimension whose wavelength fits num_rotations times into the original context
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid dividing by zero in the ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # 1: keep the frequency, 0: interpolate it
    interpolated = 1.0 / (scaling.factor * pos_freqs)
    return interpolated * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
