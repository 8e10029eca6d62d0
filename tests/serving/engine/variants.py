"""The engine world with PEFT's LoRA variants beside its plain adapters: DoRA, lora_bias,
rank_pattern + alpha_pattern, and DoRA with rsLoRA, each made and saved by PEFT itself."""

from __future__ import annotations

from pathlib import Path

from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from tests.adapters.peft_models import save_peft_adapter
from tests.serving.engine.world import World, base_model, build_world

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
VARIANTS = {  # name: save_peft_adapter keywords (ranks within the world slab's 16)
    "dora": {"rank": 4, "modules": ALL, "use_dora": True},
    "bias": {"rank": 8, "modules": ("q_proj", "o_proj", "down_proj"), "lora_bias": True},
    "patterns": {
        "rank": 8, "modules": ALL, "alpha": 12,
        "rank_pattern": {"q_proj": 2, "layers.1.mlp.down_proj": 16},
        "alpha_pattern": {"v_proj": 3, r"layers\.0\.mlp\.up_proj": 40},
    },
    "dora_rslora": {
        "rank": 8, "modules": ("k_proj", "gate_proj"), "use_dora": True, "rslora": True,
        "rank_pattern": {"gate_proj": 4},
    },
}  # fmt: skip
# Every variant, plain adapters of the world (rank 8 and rsLoRA rank 4) and base-only rows.
MIX = [*VARIANTS, "upper", "rot13", None]


def variant_world(root: Path) -> World:
    """build_world, plus VARIANTS saved under root and loaded into its slab source and PEFT."""
    world = build_world(root)
    spec = BaseModelSpec.from_dir(world.base_dir)
    for i, (name, kw) in enumerate(VARIANTS.items()):
        # PEFT's saver draws A and B at 0.1 scale: rank x hidden 64 moves greedy tokens.
        folder, _ = save_peft_adapter(root / name, base=base_model(), seed=200 + i, **kw)
        adapter = load_adapter(folder, base=spec)
        version = f"{name}@{adapter.digest}"
        world.adapters[version], world.versions[name] = adapter, version
        world.peft.load_adapter(folder, adapter_name=name)
    world.peft.eval()
    return world
