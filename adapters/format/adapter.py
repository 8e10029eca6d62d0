"""A validated PEFT LoRA adapter, exactly as PEFT writes it.

    adapter_config.json        peft_type LORA, r, lora_alpha, target_modules, use_rslora,
                               use_dora, rank_pattern, alpha_pattern, lora_bias (peft_config)
    adapter_model.safetensors  ...layers.{i}.{self_attn|mlp}.{module}.lora_A.weight  [r, in]
                               ...layers.{i}.{self_attn|mlp}.{module}.lora_B.weight  [out, r]
                               ...{module}.lora_B.bias         [out]  (lora_bias)
                               ...{module}.lora_magnitude_vector [out]  (use_dora)

The tensor file is read into modules by adapters/format/lora_modules.py; this module
checks the files are there, assembles the Adapter and gives it its warnings and digest.
Every check that fails raises AdapterError naming the problem; nothing is
stored by this module. The digest is sha256 over the config and the tensor
file (and the draft companion's digest), so identical uploads are one version.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from adapters.errors import AdapterError, quoted, shorten
from adapters.format.base_model import BaseModelSpec
from adapters.format.fused_modules import split_fused
from adapters.format.lora_modules import LoraModule, parse_weights
from adapters.format.multimodal import VISION_PARTS
from adapters.format.overflow import check_activation_bound
from adapters.format.peft_config import parse_config
from adapters.format.sources import (
    CONFIG,
    DEFAULT_MAX_BYTES,
    PICKLE_WEIGHTS,
    WEIGHTS,
    read_adapter_files,
)
from adapters.format.tensor_names import where
from adapters.format.trainable_tokens import TrainableTokens


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


def pickle_refused(label: str = "adapter") -> AdapterError:
    """The one refusal of pickled weights (adapter_model.bin), saying how to convert them."""
    return AdapterError(
        f"{label}: {PICKLE_WEIGHTS} is pickle and is refused; save with "
        "model.save_pretrained(dir, safe_serialization=True) or convert it with "
        f"safetensors.torch.save_file(torch.load(path, weights_only=True), '{WEIGHTS}')"
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
            raise pickle_refused(label)
        raise AdapterError(f"{label}: {WEIGHTS} is missing")
    config = parse_config(files[CONFIG], label, max_rank)
    scan = stored_digest is None
    modules, tokens, skipped, ignored = parse_weights(
        files[WEIGHTS], label, config, base, scan=scan
    )
    modules = split_fused(modules, base, label)  # Phi-3's qkv_proj, gate_up_proj: their parts
    if scan:
        for scale, group in _by_scale(modules).items():
            pairs = ((f"layer {k[0]} {k[1]}", m.a, m.b) for k, m in group)
            check_activation_bound(label, pairs, scale, base.dtype if base else None)
    vision = [n for n in skipped if any(part in n for part in VISION_PARTS)]
    copies = [n for n in skipped if n not in vision]
    notes = (
        [
            f"{label}: skipped {len(copies)} copies of the base model's own weights "
            f"({', '.join(shorten(n) for n in copies[:2])}); the served model's are used"
        ]
        if copies
        else []
    )
    if vision:
        notes.append(f"{label}: skipped {len(vision)} tensors of the vision tower "
                     f"({shorten(vision[0])}); text alone is served")  # fmt: skip
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


def _by_scale(modules: Mapping) -> dict[float, list]:
    """The modules grouped by their scale, for the overflow check (one scale per call)."""
    groups: dict[float, list] = {}
    for key, m in modules.items():
        groups.setdefault(m.scale, []).append((key, m))
    return groups


def _digest(config: bytes, weights: bytes, draft: Adapter | None) -> str:
    h = hashlib.sha256()
    for part in (config, weights, (draft.digest if draft else "").encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()
