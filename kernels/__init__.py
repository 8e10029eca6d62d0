"""Compute kernels: segmented-gather LoRA ops and FP8 linears. Imports nothing else of loraserve."""

from kernels.fp8 import fp8_linear, quantize_fp8
from kernels.lora_ops import lora_expand, lora_shrink
from kernels.segments import Segments, build_segments

__all__ = ["Segments", "build_segments", "fp8_linear", "lora_expand", "lora_shrink", "quantize_fp8"]
