"""A validated PEFT LoRA adapter, exactly as PEFT writes it.

    adapter_config.json        peft_type LORA, r, lora_alpha, target_modules, use_rslora,
                               use_dora, rank_pattern, alpha_pattern, lora_bias (peft_config)
    adapter_model.safetensors  ...layers.{i}.{self_attn|mlp}.{module}.lora_A.weight  [r, in]
                               ...layers.{i}.{self_attn|mlp}.{module}.lora_B.weight  [out, r]
                               ...{module}.lora_B.bias         [out]  (lora_bias)
                               ...{module}.lora_magnitude_vector [out]  (use_dora)

Every check that fails raises AdapterError naming the problem; nothing is
stored by this module. The digest is sha256 over the config and the tensor
file (and the draft companion's digest), so identical uploads are one version.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from adapters.errors import AdapterError, quoted, shorten
from adapters.format.base_model import BaseModelSpec
from adapters.format.overflow import check_activation_bound
from adapters.format.peft_config import LoraConfig, parse_config
from adapters.format.safetensors_check import check_header
from adapters.format.sources import (
    CONFIG,
    DEFAULT_MAX_BYTES,
    PICKLE_WEIGHTS,
    WEIGHTS,
    read_adapter_files,
)
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


@dataclass(frozen=True)
class Adapter:
    """A validated LoRA adapter (and, optionally, its draft-model companion)."""

    config_bytes: bytes
    weights_bytes: bytes
    rank: int  # the largest module rank: the slab rows the adapter takes
    alpha: float
    scale: float  # alpha / r, or alpha / sqrt(r) with use_rslora (a pattern may differ per module)
    target_modules: tuple[str, ...]  # sorted module names present in the tensors
    modules: Mapping[tuple[int, str], LoraModule]
    digest: str  # sha256 hex
    base_model_name: str | None = None
    draft: Adapter | None = None
    warnings: tuple[str, ...] = field(default=())
    variants: tuple[str, ...] = field(default=())  # PEFT fields beyond plain LoRA it uses
    tokens: TrainableTokens | None = None  # its own embedding rows (trainable tokens)

    @property
    def num_bytes(self) -> int:
        own = len(self.config_bytes) + len(self.weights_bytes)
        return own + (self.draft.num_bytes if self.draft else 0)

    @property
    def tensor_bytes(self) -> int:
        """The bytes of every tensor it holds: A, B, bias, magnitude, trainable tokens, its draft's."""
        parts = [t for m in self.modules.values() for t in (m.a, m.b, m.bias, m.magnitude)]
        if self.tokens is not None:
            parts += [self.tokens.ids, self.tokens.rows]
        own = sum(t.nbytes for t in parts if t is not None)
        return own + (self.draft.tensor_bytes if self.draft else 0)


def load_adapter(
    source: str | Path | Mapping[str, bytes],
    *,
    draft: str | Path | Mapping[str, bytes] | None = None,
    base: BaseModelSpec | None = None,
    base_name: str | None = None,
    max_rank: int = 64,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Adapter:
    """Read and validate an adapter from a folder, an archive or {file name: bytes}.

    With `base`, shapes, layers and modules are checked against the base model;
    `base_name` (the served model's name) only turns a different
    base_model_name_or_path into a warning.
    """
    draft_adapter = None
    if draft is not None:
        draft_adapter = parse_adapter(
            read_adapter_files(draft, max_bytes), max_rank=max_rank, label="draft"
        )
    files = read_adapter_files(source, max_bytes)
    return parse_adapter(
        files, base=base, base_name=base_name, max_rank=max_rank, draft=draft_adapter
    )


def parse_adapter(
    files: Mapping[str, bytes],
    *,
    base: BaseModelSpec | None = None,
    base_name: str | None = None,
    max_rank: int = 64,
    draft: Adapter | None = None,
    label: str = "adapter",
    stored_digest: str | None = None,
) -> Adapter:
    """Validate {file name: bytes} as a PEFT LoRA adapter.

    `stored_digest` is for a version read back from the registry, which validated
    it whole when it was published: the structure, shapes and safetensors header
    are checked again, the value scan and the hash are not (they cost more than
    reading the file).
    """
    if CONFIG not in files:
        raise AdapterError(f"{label}: {CONFIG} is missing")
    if WEIGHTS not in files:
        if PICKLE_WEIGHTS in files:
            raise AdapterError(
                f"{label}: {PICKLE_WEIGHTS} is pickle and is refused; save with "
                "model.save_pretrained(dir, safe_serialization=True) or convert it with "
                "safetensors.torch.save_file(torch.load(path, weights_only=True), "
                f"'{WEIGHTS}')"
            )
        raise AdapterError(f"{label}: {WEIGHTS} is missing")
    config = parse_config(files[CONFIG], label, max_rank)
    scan = stored_digest is None
    modules, tokens, skipped, ignored = _parse_weights(
        files[WEIGHTS], label, config, base, scan=scan
    )
    if scan:
        for scale, group in _by_scale(modules).items():
            pairs = ((f"layer {k[0]} {k[1]}", m.a, m.b) for k, m in group)
            check_activation_bound(label, pairs, scale, base.dtype if base else None)
    notes = (
        [
            f"{label}: skipped {len(skipped)} copies of the base model's own weights "
            f"({', '.join(shorten(n) for n in skipped[:2])}); the served model's are used"
        ]
        if skipped
        else []
    )
    if ignored:
        notes.append(
            f"{label}: ignored the weights of {len(ignored)} module(s) that {CONFIG} does not "
            f"target ({', '.join(where(*k) for k in ignored[:3])}{', ...' if len(ignored) > 3 else ''}), "
            "as PEFT does"
        )
    trained_on = config.base_model_name
    if base_name and trained_on and trained_on != base_name:
        notes.append(
            f"{label}: trained on {quoted(trained_on)}, served with {base_name!r}; its shapes fit"
        )
    return Adapter(
        config_bytes=bytes(files[CONFIG]),
        weights_bytes=bytes(files[WEIGHTS]),
        rank=max((m.a.shape[0] for m in modules.values()), default=0),
        alpha=config.alpha,
        scale=config.scale,
        target_modules=tuple(sorted({m for _, m in modules})),
        modules=modules,
        digest=stored_digest or _digest(files[CONFIG], files[WEIGHTS], draft),
        base_model_name=trained_on,
        draft=draft,
        warnings=tuple(notes),
        variants=config.variants,
        tokens=tokens,
    )


def _parse_weights(
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
    # As PEFT loads it: a module the config does not select gets no LoRA, whatever the file holds.
    ignored = sorted((layer, module) for layer, module, name in parts if not config.selects(name))
    modules = {}
    for (layer, module, model_name), found in sorted(parts.items()):
        if (layer, module) in ignored:
            continue
        here = f"{label}: {where(layer, module)}"
        modules[(layer, module)] = _module(here, layer, module, model_name, found, config, base)
    if not modules:
        chosen = " that its target_modules select" if ignored else ""
        raise AdapterError(f"{label}: {WEIGHTS} holds no LoRA module (lora_A and lora_B){chosen}")
    return modules, rows, skipped, ignored


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
    if base is not None:
        _check_against_base(where, layer, module, a, b, base)
    return LoraModule(layer, module, a, b, config.scale_of(name), **vectors)


def _by_scale(modules: Mapping) -> dict[float, list]:
    """The modules grouped by their scale, for the overflow check (one scale per call)."""
    groups: dict[float, list] = {}
    for key, m in modules.items():
        groups.setdefault(m.scale, []).append((key, m))
    return groups


def _check_against_base(where, layer, module, a, b, base: BaseModelSpec) -> None:
    outer = layer == OUTER_LAYER
    shapes = base.outer_shapes if outer else base.shapes
    if module not in shapes:
        if outer:
            raise AdapterError(
                f"{where}: this server serves no LoRA on {module} (lora.embeddings is off)"
            )
        known = ", ".join(base.shapes)
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


def _digest(config: bytes, weights: bytes, draft: Adapter | None) -> str:
    h = hashlib.sha256()
    for part in (config, weights, (draft.digest if draft else "").encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()
