"""The engine world with adapters outside the decoder layers beside its plain adapters: LoRA on
embed_tokens + lm_head (+ v_proj), and PEFT's trainable tokens, each made and saved by PEFT."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from peft import PeftModel

from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from tests.adapters.peft_models import save_peft_adapter
from tests.serving.engine.world import World, base_model, build_world

# Ids the "tokens" adapter trains: prompts carry them, and greedy decoding meets them.
IDS = [7, 42, 99, 128, 200, 311, 404, 480]
OUTER = {  # name: save_peft_adapter keywords (ranks within the world slab's 16)
    "outer": {"rank": 6, "modules": ("embed_tokens", "lm_head", "v_proj")},
    "tokens": {"rank": 4, "modules": ("q_proj",), "trainable_token_indices": IDS},
}
# Both, plain adapters of the world (rank 8 and rsLoRA rank 4) and base-only rows.
MIX = [*OUTER, "upper", "rot13", None]


@dataclass
class OuterWorld(World):
    # Adapters with a PEFT model of their own: PEFT loads no second adapter beside
    # trainable tokens into one PeftModel.
    own: dict[str, PeftModel] = field(default_factory=dict)

    def reference(self, prompt: list[int], name: str | None, max_new: int) -> list[int]:
        """Greedy tokens of transformers + PEFT generating this request alone."""
        if name not in self.own:
            return super().reference(prompt, name, max_new)
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = self.own[name].generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                do_sample=False, eos_token_id=None, pad_token_id=0,
            )  # fmt: skip
        return out[0, len(prompt) :].tolist()


def outer_world(root: Path) -> OuterWorld:
    """build_world, plus OUTER saved under root, loaded into its slab source and PEFT."""
    world = OuterWorld(**vars(build_world(root)))
    spec = BaseModelSpec.from_dir(world.base_dir)
    for i, (name, kw) in enumerate(OUTER.items()):
        folder, _ = save_peft_adapter(root / name, base=base_model(), seed=300 + i, **kw)
        adapter = load_adapter(folder, base=spec)
        version = f"{name}@{adapter.digest}"
        world.adapters[version], world.versions[name] = adapter, version
        if "trainable_token_indices" in kw:
            world.own[name] = PeftModel.from_pretrained(base_model(), folder).eval()
        else:
            world.peft.load_adapter(folder, adapter_name=name)
    world.peft.eval()
    return world


def carrying_ids(gen: torch.Generator, n: int) -> list[int]:
    """A prompt of n random ids, every third one of IDS."""
    prompt = torch.randint(0, 512, (n,), generator=gen)
    pick = torch.randint(0, len(IDS), (n,), generator=gen)
    prompt[::3] = torch.tensor(IDS)[pick[::3]]
    return prompt.tolist()
