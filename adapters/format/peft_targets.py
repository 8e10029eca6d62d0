"""Which modules a PEFT LoRA config selects: target_modules, exclude_modules, layers_to_transform.

PEFT injects LoRA into the modules these select and ignores saved tensors of any other
(peft.tuners.tuners_utils.check_target_module_exists), so a config naming fewer modules
than its file holds is served with those only, as PEFT serves it. For a module's name in
the model (`model.layers.3.self_attn.q_proj`):

    exclude_modules   a list: the name is an entry or ends with "." + an entry; a string: a
                      regex the whole name matches. Excluded modules are never selected.
    target_modules    a string: a regex the whole name matches. A list: the name is an entry,
                      or ends with "." + an entry, and then, with layers_to_transform, the
                      first numbered segment of the name (the layer) must be listed, so a
                      module outside the layers (embed_tokens, lm_head) is not selected.
                      "all-linear": the list of every decoder linear (not lm_head).
                      null: every module the file holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import regex

from adapters.errors import AdapterError, quoted, shorten
from adapters.format.base_model import FUSED_LINEARS, LINEARS, ROUTER

MAX_ENTRIES = 4096
MAX_REGEX_CHARS = 1024
ALL_LINEAR = "all-linear"
_LAYER = regex.compile(r".*?\.[^.]*\.(?P<idx>\d+)\.")  # PEFT's: the first numbered segment
FullMatch = Callable[[str, str, str], bool]  # (field, pattern, name): a bounded fullmatch


@dataclass(frozen=True)
class Targets:
    """The selecting fields of a config: a regex string, a tuple of entries, or None."""

    modules: str | tuple[str, ...] | None = None
    exclude: str | tuple[str, ...] | None = None
    layers: tuple[int, ...] | None = None  # layers_to_transform; None or empty: every layer

    def selects(self, name: str, fullmatch: FullMatch) -> bool:
        """Whether PEFT would put LoRA on the module named `name` in the model."""
        if self.exclude is not None and _hit("exclude_modules", self.exclude, name, fullmatch):
            return False
        if self.modules is None:
            return True
        if isinstance(self.modules, str):
            return fullmatch("target_modules", self.modules, name)
        if name in self.modules:
            return True
        if not any(name.endswith("." + entry) for entry in self.modules):
            return False
        if not self.layers:
            return True
        m = _LAYER.match(name)
        return m is not None and int(m["idx"]) in self.layers


def parse_targets(config: dict, label: str) -> Targets:
    """The config's selecting fields, checked; AdapterError naming the field if malformed."""
    modules = _names(config, "target_modules", label)
    if modules == ALL_LINEAR:
        # as PEFT expands it: every linear but the output layer (Phi-3's are fused; a
        # mixture of experts' router is one where experts are linears, transformers 4)
        modules = LINEARS + FUSED_LINEARS + (ROUTER,)
    layers = config.get("layers_to_transform")
    if isinstance(layers, int) and not isinstance(layers, bool):
        layers = [layers]
    if layers is not None and not (
        isinstance(layers, list) and len(layers) <= MAX_ENTRIES
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers)
    ):  # fmt: skip
        raise AdapterError(
            f"{label}: layers_to_transform must be a layer index or a list of them, got "
            f"{quoted(layers)}"
        )
    return Targets(modules, _names(config, "exclude_modules", label),
                   tuple(layers) if layers is not None else None)  # fmt: skip


def _names(config: dict, key: str, label: str) -> str | tuple[str, ...] | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        if len(value) > MAX_REGEX_CHARS:
            raise AdapterError(f"{label}: {key}: {shorten(value)} is longer than {MAX_REGEX_CHARS}")
        if value != ALL_LINEAR:
            try:
                regex.compile(value)
            except regex.error as exc:
                raise AdapterError(
                    f"{label}: {key} {quoted(value)} is not a valid regex ({exc})"
                ) from None
        return value
    if (
        not isinstance(value, list) or len(value) > MAX_ENTRIES
        or not all(isinstance(v, str) and len(v) <= MAX_REGEX_CHARS for v in value)
    ):  # fmt: skip
        raise AdapterError(
            f"{label}: {key} must be a list of module names or one regex, got {quoted(value)}"
        )
    return tuple(value)


def _hit(field: str, names: str | tuple[str, ...], name: str, fullmatch: FullMatch) -> bool:
    if isinstance(names, str):
        return fullmatch(field, names, name)
    return name in names or any(name.endswith("." + entry) for entry in names)
