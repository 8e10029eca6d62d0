"""The committed demo kit, served by the engine the way `loraserve serve` serves it."""

from __future__ import annotations

import sys
from pathlib import Path

from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from serving.engine.engine import Engine, EngineConfig
from serving.model.loader import load_model

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"
ADAPTERS = ("upper", "comment", "rot13")  # the style adapters, each with a draft companion
TOOLS = "tools"  # the tool-calling adapter (no companion)

sys.path.insert(0, str(DEMO))  # the kit's own transformations and measures
from kit import corpus, tool_calls, transforms  # noqa: E402

__all__ = ["ADAPTERS", "DEMO", "TOOLS", "corpus", "demo_engine", "tool_calls", "transforms"]


def demo_engine(quantization: str = "none") -> tuple[Engine, dict[str, str]]:
    """An engine on the kit's base with its four adapters; returns it and name -> version."""
    loaded = load_model(DEMO / "base", quantization=quantization, dtype="float32")
    spec = BaseModelSpec.from_dir(DEMO / "base")
    adapters = {}
    for name in (*ADAPTERS, TOOLS):
        adapter = load_adapter(DEMO / "adapters" / name, base=spec)
        adapters[f"{name}@{adapter.digest}"] = adapter
    slab = AdapterSlab(spec, num_slots=4, max_rank=16, max_cpu_loras=0, loader=adapters.__getitem__)
    config = EngineConfig(block_size=16, num_blocks=256, max_model_len=2048)
    engine = Engine(loaded.model, loaded.tokenizer, config, slab=slab)
    return engine, {v.split("@")[0]: v for v in adapters}
