"""On CUDA: a decode step makes no host sync in the forward, and CUDA graphs change no output.

- Under torch.cuda.set_sync_debug_mode("error"), a mixed-adapter decode step over an FP8
  base runs its whole forward, eager or replayed, without one host-device sync: the only
  read is the sampler's, outside.
- The engine with decode graphs gives the same greedy tokens as without them, and its
  graphs did run.
"""

import pytest
import torch

from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from serving.engine.engine import Engine, EngineConfig
from serving.engine.request import GenerateRequest, SamplingParams
from serving.model.decode_graphs import DecodeGraphs
from serving.model.loader import load_model
from serving.model.step_plan import plan_step
from tests.serving.engine.world import build_world
from tests.serving.model.steps import BlockPool, Seq, step_for

pytestmark = pytest.mark.gpu
BLOCK, BLOCKS = 16, 64


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("gpu"))


def served(world, *, fp8: bool):
    loaded = load_model(world.base_dir, quantization="fp8" if fp8 else "none", dtype="float32",
                        device="cuda")  # fmt: skip
    slab = AdapterSlab(BaseModelSpec.from_dir(world.base_dir), num_slots=8, max_rank=16,
                       max_cpu_loras=0, loader=world.adapters.__getitem__, device="cuda")  # fmt: skip
    return loaded, slab


def test_a_decode_step_does_not_sync(world, monkeypatch):
    # The serving path: without LORASERVE_CHECKS' per-layer checks, which read back on purpose.
    monkeypatch.setenv("LORASERVE_CHECKS", "0")
    loaded, slab = served(world, fp8=True)
    model = loaded.model
    slots = [slab.acquire(v) for v in world.adapters] + [-1]
    seqs = [Seq(list(range(3 + i, 9 + 2 * i)), slot=slots[i % len(slots)]) for i in range(9)]
    pool = BlockPool(BLOCKS)
    kv = model.allocate_kv(BLOCKS + 1, BLOCK)
    graphs = DecodeGraphs(model, kv, slab, scratch_block=BLOCKS, block_size=BLOCK, max_context=64)
    with torch.inference_mode():
        model.forward(plan_step(step_for(seqs, BLOCK, pool, all_logits=False), kv, slab))
        for round_ in range(3):
            for s in seqs:
                s.tokens.append(round_ + 1)
            step = step_for(seqs, BLOCK, pool, all_logits=False)
            assert graphs.covers(step)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:  # round 0 eager, then replays
                out = (
                    model.forward(plan_step(step, kv, slab))
                    if round_ == 0
                    else graphs.forward(step)
                )
            finally:
                torch.cuda.set_sync_debug_mode("default")
            assert out.shape == (9, model.config.vocab_size)
            assert bool(torch.isfinite(out).all())  # the sampler's read: a sync, outside


def greedy(world, *, fp8: bool, graphs: bool) -> tuple[dict[str, list[int]], int]:
    """Each request's greedy tokens, and how many steps replayed a graph."""
    loaded, slab = served(world, fp8=fp8)
    config = EngineConfig(num_blocks=BLOCKS, block_size=BLOCK, cuda_graphs=graphs)
    engine = Engine(loaded.model, loaded.tokenizer, config, slab=slab)
    assert (engine.forward.graphs is not None) == graphs
    replays = []
    if graphs:
        replay = engine.forward.graphs.forward
        engine.forward.graphs.forward = lambda step: replays.append(1) or replay(step)
    out: dict[str, list[int]] = {}
    params = SamplingParams(max_tokens=12, temperature=0.0)
    for i, version in enumerate([None, *world.adapters, None]):
        prompt = tuple(range(5 + i, 12 + 2 * i))
        engine.submit(GenerateRequest(f"r{i}", prompt, params, version),
                      lambda o: out.setdefault(o.request_id, []).extend(o.new_token_ids))  # fmt: skip
    engine.run_until_idle()
    return out, len(replays)


@pytest.mark.parametrize("fp8", [False, True], ids=["fp32", "fp8"])
def test_graphs_give_the_eager_engine_tokens(world, fp8):
    eager, _ = greedy(world, fp8=fp8, graphs=False)
    replayed, replays = greedy(world, fp8=fp8, graphs=True)
    assert replays >= 10
    assert replayed == eager
