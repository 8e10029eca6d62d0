"""A LoRA on a fused linear (Phi-3's qkv_proj, gate_up_proj) is the LoRAs of its parts.

    qkv_proj:     W [q + 2 kv, in]  ->  q_proj, k_proj, v_proj
    gate_up_proj: W [2 inter, in]   ->  gate_proj, up_proj

The fused module's delta is scale * B A with B [sum of the parts' outputs, r]: each part's
rows of it are scale * B_part A, so the parts share A [r, in] and each takes its own rows
of B (and of lora_B's bias and DoRA's magnitude, both per output row; DoRA's norm is per
row too). The split is exact, and works on any base whose parts have these shapes: a
Phi-3 adapter on its Llama-layout twin, or the other way round.
"""

from __future__ import annotations

from collections.abc import Mapping

from adapters.errors import AdapterError
from adapters.format.base_model import FUSED, BaseModelSpec
from adapters.format.lora_modules import LoraModule
from adapters.format.tensor_names import where


def split_fused(
    modules: Mapping[tuple[int, str], LoraModule], base: BaseModelSpec | None, label: str
) -> dict[tuple[int, str], LoraModule]:
    """modules with each fused module replaced by its parts; AdapterError if a part is also
    adapted on its own, or if there is no base model to say where the parts split."""
    out = {key: m for key, m in modules.items() if key[1] not in FUSED}
    for (layer, module), m in sorted(modules.items()):
        if module not in FUSED:
            continue
        if base is None:
            raise AdapterError(
                f"{label}: {where(layer, module)} is a fused module, whose split into "
                f"{', '.join(FUSED[module])} needs the base model (--base MODEL_DIR)"
            )
        start = 0
        for part in FUSED[module]:
            if (layer, part) in out:
                raise AdapterError(
                    f"{label}: {where(layer, part)} is adapted both on its own and within {module}"
                )
            rows = slice(start, start + base.shapes[part][1])
            start = rows.stop
            out[layer, part] = LoraModule(
                layer, part, m.a, m.b[rows], m.scale,
                None if m.bias is None else m.bias[rows],
                None if m.magnitude is None else m.magnitude[rows],
            )  # fmt: skip
    return out
