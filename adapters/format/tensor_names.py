"""Which LoRA tensor a name in PEFT's adapter_model.safetensors is.

    ...layers.{i}.{self_attn|mlp}.{module}.lora_A.weight / lora_B.weight / lora_B.bias
    ...layers.{i}.{self_attn|mlp}.{module}.lora_magnitude_vector          (DoRA)
    ...layers.{i}.mlp.experts.{e}.{gate|up|down}_proj.lora_A.weight ...  one expert's LoRA
    ...layers.{i}.mlp.experts[.base_layer].lora_A.weight [r * E, in] / lora_B.weight
                         [out, r * E]   every expert's LoRA on one stacked parameter (PEFT's
                         target_parameters), split by adapters.format.expert_modules
    ...embed_tokens.lora_embedding_A [r, vocab] / lora_embedding_B [hidden, r]
    ...lm_head.lora_A.weight [r, hidden] / lora_B.weight [vocab, r] (/ bias, magnitude)
    ...embed_tokens.token_adapter.trainable_tokens_delta [n, hidden]   (trainable tokens)
    ...{embed_tokens|lm_head}.base_layer.weight    a copy of the base's own, which PEFT
                                                   saves beside embedding LoRA: skipped
    ...vision_tower. / multi_modal_projector. ...  a multimodal model's image side, which
                                                   is not served: skipped

The embedding and the LM head are "outer" modules, keyed by layer OUTER_LAYER (-1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from adapters.errors import AdapterError, quoted, shorten
from adapters.format.base_model import FUSED_LINEARS, LINEARS, expert_of, module_group
from adapters.format.multimodal import VISION_PARTS

OUTER_LAYER = -1
MAX_LAYER_DIGITS = 6  # no model has a million layers; int() of 5,000 digits raises ValueError
_LAYER_RE = re.compile(
    r"(?:^|\.)layers\.(?P<layer>[0-9]+)\.(?P<block>self_attn|mlp)"
    r"\.(?P<module>experts(?:\.base_layer)*|(?:experts\.[0-9]{1,6}\.)?[A-Za-z0-9_]+)"
    r"\.(?:lora_(?P<which>A|B)\.weight|lora_B\.(?P<bias>bias)"
    r"|(?P<magnitude>lora_magnitude_vector)(?:\.weight)?)$"
)
_OUTER_RE = re.compile(
    r"(?:^|\.)(?P<module>embed_tokens|lm_head)\.(?:lora_embedding_(?P<embedding>A|B)"
    r"|lora_(?P<which>A|B)\.weight|lora_B\.(?P<bias>bias)"
    r"|(?P<magnitude>lora_magnitude_vector)(?:\.weight)?"
    r"|token_adapter\.(?P<tokens>trainable_tokens_delta)|(?P<base>base_layer\.weight))$"
)
PART_NAMES = {
    "A": "lora_A", "B": "lora_B", "bias": "lora_B.bias",
    "magnitude": "lora_magnitude_vector", "tokens": "trainable_tokens_delta",
}  # fmt: skip


@dataclass(frozen=True)
class TensorName:
    """A tensor's place: (layer or OUTER_LAYER, module, part), the name PEFT's patterns
    match the module by, and whether it is a base weight copy to skip."""

    layer: int
    module: str
    part: str  # A, B, bias, magnitude or tokens
    model_name: str  # e.g. model.layers.3.self_attn.q_proj, model.embed_tokens, lm_head
    skipped: bool = False


def tensor_name(name: str, label: str) -> TensorName:
    """Where the tensor `name` goes; AdapterError naming it if it is no LoRA tensor we know."""
    if any(part in name for part in VISION_PARTS):  # text is served: their LoRA is skipped
        return TensorName(OUTER_LAYER, "vision", "vision", name, skipped=True)
    m = _LAYER_RE.search(name)
    if m is not None:
        if len(m["layer"]) > MAX_LAYER_DIGITS:
            raise AdapterError(f"{label}: tensor {quoted(name)} has an out-of-range layer index")
        module, block = m["module"], m["block"]
        known = module in (*LINEARS, *FUSED_LINEARS) or expert_of(module) or module == "experts"
        if known and block != module_group(module):
            raise AdapterError(
                f"{label}: tensor {quoted(name)} puts {shorten(module)} under {block}"
            )
        part = m["which"] or ("bias" if m["bias"] else "magnitude")
        layer = int(m["layer"])
        # the module's own path, as PEFT's patterns see it (a multimodal model's text layers
        # are model.language_model.layers...)
        prefix = name[: m.start()].removeprefix("base_model.model").lstrip(".") or "model"
        return TensorName(layer, module, part, f"{prefix}.layers.{layer}.{block}.{module}")
    m = _OUTER_RE.search(name)
    if m is None:
        raise AdapterError(
            f"{label}: tensor {quoted(name)} matches no LoRA module (…layers.N.<module>.lora_A/B.weight)"
        )
    module = m["module"]
    model_name = "model.embed_tokens" if module == "embed_tokens" else "lm_head"
    if m["base"]:
        return TensorName(OUTER_LAYER, module, "base", model_name, skipped=True)
    if module == "embed_tokens" and (m["which"] or m["bias"] or m["magnitude"]):
        raise AdapterError(
            f"{label}: tensor {quoted(name)}: embed_tokens LoRA is lora_embedding_A/B "
            "(a bias or DoRA on the embedding is not supported)"
        )
    if module == "lm_head" and (m["embedding"] or m["tokens"]):
        raise AdapterError(f"{label}: tensor {quoted(name)} does not belong on lm_head")
    part = (
        m["embedding"] or m["which"] or ("bias" if m["bias"] else None)
        or ("magnitude" if m["magnitude"] else "tokens")
    )  # fmt: skip
    return TensorName(OUTER_LAYER, module, part, model_name)


def where(layer: int, module: str) -> str:
    """How messages name a module: 'layer 3 q_proj', or 'lm_head'."""
    return module if layer == OUTER_LAYER else f"layer {layer} {module}"
