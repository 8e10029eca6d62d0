"""`loraserve quantize SRC DST`: write an FP8 copy of a Hugging Face checkpoint that loads as is.

The copy is a compressed-tensors checkpoint, as llm-compressor's FP8-dynamic scheme writes
one: the layout vLLM and SGLang read, and transformers loads (tests/serving/model/
test_quantize.py). Each linear of the decoder (q/k/v/o, gate/up/down, and each expert's)
becomes `<name>.weight` in float8_e4m3fn plus `<name>.weight_scale`, float32 [out, 1] (per
output channel), with activations quantized per token as they come; everything else
(embeddings, norms, LM head, router, biases) keeps its dtype. config.json gains the
`quantization_config` that says so, which the loader reads
(serving.model.fp8_formats), so it never quantizes twice.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from rich.progress import Progress
from safetensors.torch import save_file

from kernels import quantize_fp8
from serving.model.checkpoint import load_state_dict
from serving.model.errors import ModelLoadError
from serving.model.fp8_formats import COMPRESSED_TENSORS

SCALE_SUFFIX = ".weight_scale"
# and Phi-3's fused qkv_proj and gate_up_proj (split by rows on loading, scales with them)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
           "qkv_proj", "gate_up_proj")  # fmt: skip
_FP8_ARGS = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None}
# Modules kept as stored, as llm-compressor's recipes name them: the LM head, a sparse MLP's
# router, and a multimodal checkpoint's vision tower and projector.
IGNORED = ("lm_head", "re:.*mlp\\.gate$", "re:.*vision_tower.*", "re:.*multi_modal_projector.*")
# compressed-tensors' FP8-dynamic scheme as llm-compressor writes it: every Linear but IGNORED
QUANTIZATION_CONFIG = {
    "quant_method": COMPRESSED_TENSORS,
    "format": "float-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {**_FP8_ARGS, "strategy": "channel", "dynamic": False},
        "input_activations": {**_FP8_ARGS, "strategy": "token", "dynamic": True},
        "output_activations": None,
        "format": "float-quantized",
    }},
    "ignore": list(IGNORED),
    "kv_cache_scheme": None,
    "sparsity_config": {},
    "transform_config": {},
    "global_compression_ratio": None,
}  # fmt: skip
_COPIED = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def is_quantized_linear(name: str) -> bool:
    """Whether `name` is a decoder linear's weight, the tensors quantize writes in FP8 (a
    vision tower's are IGNORED)."""
    module = name.removesuffix(".weight")
    if module == name or any(re.fullmatch(p[3:], module) for p in IGNORED if p.startswith("re:")):
        return False
    return module.rsplit(".", 1)[-1] in LINEARS


def quantize_checkpoint(src: str | Path, dst: str | Path, *, show_progress: bool = True) -> int:
    """Write DST from SRC with FP8 linears; returns the number of tensors quantized."""
    src, dst = Path(src), Path(dst)
    config = json.loads(_read(src / "config.json"))
    if config.get("quantization_config"):
        method = config["quantization_config"].get("quant_method")
        raise ModelLoadError(f"{src}: already quantized ({method}); quantize the original weights")
    state = load_state_dict(src)
    if dst.exists() and any(dst.iterdir()):
        raise ModelLoadError(f"{dst}: exists and is not empty")
    dst.mkdir(parents=True, exist_ok=True)
    out: dict[str, torch.Tensor] = {}
    count = 0
    with Progress(disable=not show_progress, transient=True) as progress:
        task = progress.add_task("quantizing", total=len(state))
        for name, tensor in state.items():
            if is_quantized_linear(name):
                w_q, scale = quantize_fp8(tensor)  # scale [out]: stored [out, 1], per channel
                out[name], out[name[: -len(".weight")] + SCALE_SUFFIX] = w_q, scale[:, None]
                count += 1
            else:
                out[name] = tensor.contiguous()
            progress.advance(task)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config["quantization_config"] = QUANTIZATION_CONFIG
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in _COPIED:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    return count


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: not found") from None
