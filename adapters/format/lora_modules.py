"""An adapter's tensor file read into LoraModules, each checked against its config and base.

    ...layers.{i}.{self_attn|mlp}.{module}.lora_A.weight  [r, in]
    ...layers.{i}.{self_attn|mlp}.{module}.lora_B.weight  [out, r]
    ...{module}.lora_B.bias         [out]  (lora_bias)
    ...{module}.lora_magnitude_vector [out]  (use_dora)

A module's rank, bias and DoRA magnitude must be what the config says (peft_config), and
with a base model its layer, module and shapes must be the base's. The embedding's
trainable tokens are read here too (trainable_tokens). Every failure raises AdapterError
naming the problem; adapters/format/adapter.py assembles the Adapter from what is read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adapters.errors import AdapterError, quoted, shorten
from adapters.format.base_model import FUSED, BaseModelSpec, expert_of
from adapters.format.expert_modules import STACKED, split_stacked
from adapters.format.peft_config import LoraConfig
from adapters.format.safetensors_check import check_header
from adapters.format.sources import WEIGHTS
from adapters.format.tensor_names import OUTER_LAYER, PART_NAMES, tensor_name, where
from adapters.format.tensor_views import has_nonfinite, tensor_views
from adapters.format.trainable_tokens import TrainableTokens, read_tokens


@dataclass(frozen=True)
class LoraModule:
    """One adapted linear: y = W x + scale * (b @ a x + bias), or with DoRA
    y = m / ||W + scale * b @ a||_row * (W x + scale * (b @ a x + bias)) (base bias apart)."""

    layer: int
    module: str
    a: torch.Tensor  # [r, in]; r is this module's rank (rank_pattern)
    b: torch.Tensor  # [out, r]
    scale: float = 1.0  # alpha / r of this module (alpha_pattern, rsLoRA)
    bias: torch.Tensor | None = None  # [out] lora_B's bias (lora_bias)
    magnitude: torch.Tensor | None = None  # [out] DoRA's m (use_dora)


def parse_weights(
    data: bytes, label: str, config: LoraConfig, base: BaseModelSpec | None, scan: bool
) -> tuple[dict[tuple[int, str], LoraModule], TrainableTokens | None, list[str], list]:
    """The modules, the trainable tokens, the names of the base-weight copies skipped, and
    the (layer, module) pairs whose weights the config's target fields leave unselected."""
    header = check_header(data, f"{label}: {WEIGHTS}")
    names, seen, skipped = {}, set(), []
    for name in header:
        t = tensor_name(name, label)
        if t.skipped:
            skipped.append(name)
            continue
        if (t.layer, t.module, t.part) in seen:
            raise AdapterError(
                f"{label}: tensor {quoted(name)} repeats {where(t.layer, shorten(t.module))} "
                f"{PART_NAMES[t.part]}"
            )
        seen.add((t.layer, t.module, t.part))
        names[name] = t
    if not names:
        raise AdapterError(f"{label}: {WEIGHTS} holds no tensors")
    tensors = tensor_views(data, header)
    parts: dict[tuple[int, str, str], dict[str, torch.Tensor]] = {}
    for name, t in names.items():
        tensor = tensors[name]
        if scan and has_nonfinite(tensor):
            raise AdapterError(f"{label}: tensor {quoted(name)} contains NaN or Inf")
        parts.setdefault((t.layer, t.module, t.model_name), {})[t.part] = tensor
    tokens = parts.pop((OUTER_LAYER, "embed_tokens", "model.embed_tokens"), {})
    if tokens.keys() - {"tokens"}:
        if "tokens" in tokens:
            raise AdapterError(
                f"{label}: embed_tokens has both LoRA and trainable tokens; PEFT trains one"
            )
        parts[OUTER_LAYER, "embed_tokens", "model.embed_tokens"] = tokens
    vocab, hidden = (base.vocab_size, base.hidden_size) if base else (0, None)
    rows = read_tokens(config.token_indices, tokens.get("tokens"), label, vocab, hidden)
    modules, ignored = {}, []
    for layer, module, name in [k for k in parts if k[1] in STACKED]:  # target_parameters'
        found = parts.pop((layer, module, name))
        param, split = split_stacked(layer, module, name, found, config, base,
                                     f"{label}: {where(layer, module)}")  # fmt: skip
        for key, (a, b, scale) in split.items():
            if key in modules:
                raise AdapterError(f"{label}: {where(*key)} is adapted twice ({param})")
            modules[key] = LoraModule(key[0], key[1], a, b, scale)
        if param is None:
            ignored.append((layer, module))
    # As PEFT loads it: a module the config does not select gets no LoRA, whatever the file holds.
    chosen = {key: _chosen_as(config, key[2]) for key in parts}
    ignored += sorted((layer, m) for (layer, m, _), name in chosen.items() if name is None)
    for (layer, module, model_name), found in sorted(parts.items()):
        if (layer, module) in ignored:
            continue
        here = f"{label}: {where(layer, module)}"
        if (layer, module) in modules:
            raise AdapterError(f"{here}: is adapted both on its own and in a stacked parameter")
        name = chosen[layer, module, model_name]
        modules[(layer, module)] = _module(here, layer, module, name, found, config, base)
    if not modules:
        chosen = " that its target_modules select" if ignored else ""
        raise AdapterError(f"{label}: {WEIGHTS} holds no LoRA module (lora_A and lora_B){chosen}")
    return modules, rows, skipped, ignored


def _chosen_as(config: LoraConfig, name: str) -> str | None:
    """The name PEFT matches the module named `name`'s rank and alpha patterns by, if it puts
    LoRA on it: `name` where target_modules selects it, `name.weight` where target_parameters
    does (a 2-D parameter's LoRA is laid out as a linear's: a transformers 5 router); None."""
    if config.selects(name):
        return name
    return f"{name}.weight" if config.selects_parameter(f"{name}.weight") else None


def _module(where, layer, module, name, found, config: LoraConfig, base) -> LoraModule:
    """One module's tensors checked against the config: its rank, bias and DoRA magnitude."""
    if "A" not in found or "B" not in found:
        have = "lora_A" if "A" in found else "lora_B" if "B" in found else None
        if have:
            raise AdapterError(f"{where}: has {have} without its pair")
        extra = ", ".join(PART_NAMES[p] for p in sorted(found))
        raise AdapterError(f"{where}: has {extra} without lora_A and lora_B")
    a, b = found["A"], found["B"]
    rank = config.rank_of(name)
    if a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
        source = "rank_pattern" if rank != config.rank else "r"
        raise AdapterError(
            f"{where}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit rank "
            f"{rank} ({source}; expected [r, in] and [out, r])"
        )
    vectors = {}
    for part, field_name, wanted in (
        ("bias", "lora_bias", config.lora_bias),
        ("magnitude", "use_dora", config.use_dora),
    ):
        t = found.get(part)
        if wanted and t is None:
            raise AdapterError(f"{where}: {field_name} is set but {PART_NAMES[part]} is missing")
        if not wanted and t is not None:
            raise AdapterError(f"{where}: has {PART_NAMES[part]} but {field_name} is not set")
        if t is not None and (t.dim() != 1 or t.shape[0] != b.shape[0]):
            raise AdapterError(
                f"{where}: {PART_NAMES[part]} {tuple(t.shape)} does not fit lora_B's {b.shape[0]} outputs"
            )
        vectors[part] = t
    if expert_of(module) and any(t is not None for t in vectors.values()):
        raise AdapterError(f"{where}: lora_bias and DoRA on an expert are not served "
                           "(PEFT trains neither on stacked experts)")  # fmt: skip
    if base is not None:
        _check_against_base(where, layer, module, a, b, base)
    return LoraModule(layer, module, a, b, config.scale_of(name), **vectors)


def _check_against_base(where, layer, module, a, b, base: BaseModelSpec) -> None:
    outer = layer == OUTER_LAYER
    shapes = base.outer_shapes if outer else base.shapes
    if not outer and module in FUSED:
        shapes = {module: base.fused_shape(module)}
    if module not in shapes:
        if outer:
            raise AdapterError(
                f"{where}: this server serves no LoRA on {module} (lora.embeddings is off)"
            )
        known = base.module_names()
        raise AdapterError(
            f"{where}: the base model has no module {quoted(module)} (it has {known})"
        )
    if not outer and layer >= base.num_layers:
        raise AdapterError(
            f"{where}: layer {layer} is out of range; the base model has {base.num_layers}"
        )
    fan_in, fan_out = shapes[module]
    if a.shape[1] != fan_in or b.shape[0] != fan_out:
        raise AdapterError(
            f"{where}: shapes lora_A {tuple(a.shape)}, lora_B {tuple(b.shape)} do not fit the base "
            f"model's {module} [{fan_out}, {fan_in}]"
        )
