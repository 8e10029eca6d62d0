"""A config's `layer_types` (transformers 5): which layers attend through a sliding window."""

from __future__ import annotations

from serving.model.errors import ModelLoadError

LAYER_TYPES = ("full_attention", "sliding_attention")


def sliding_layers(types: object, num_layers: int, where: str) -> tuple[int, ...]:
    """The indices of the sliding layers; ModelLoadError naming layer_types if it is not one
    of LAYER_TYPES per layer."""
    if not isinstance(types, list) or len(types) != num_layers:
        raise ModelLoadError(f"{where}: layer_types must list each of the {num_layers} layers")
    unknown = sorted({str(t) for t in types} - set(LAYER_TYPES))
    if unknown:
        raise ModelLoadError(f"{where}: layer_types {unknown[0]!r} is not supported "
                             f"({', '.join(LAYER_TYPES)})")  # fmt: skip
    return tuple(i for i, t in enumerate(types) if t == "sliding_attention")
