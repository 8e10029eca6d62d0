"""A mixed batch, a different adapter per row with base-only rows in between, against PEFT's
own mixed-batch forward (`adapter_names`); base-only rows against the plain base model."""

import pytest
import torch
from peft import PeftModel

from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from serving.model.checkpoint import load_state_dict
from serving.model.hf_config import load_model_config
from serving.model.llama import LlamaModel
from serving.model.step_plan import plan_step
from tests.adapters.peft_models import save_base, save_peft_adapter, tiny_llama
from tests.serving.model.steps import BlockPool, Seq, step_for

BLOCK = 4
ADAPTERS = {  # name: rank, target modules, rsLoRA
    "a1": (8, ("q_proj", "v_proj"), False),
    "a2": (4, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), True),
    "a3": (16, ("down_proj", "up_proj"), False),
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base_dir = save_base(root / "base")
    dirs = {
        name: save_peft_adapter(root / name, rank=r, modules=m, rslora=rs, seed=i + 1)[0]
        for i, (name, (r, m, rs)) in enumerate(ADAPTERS.items())
    }
    peft = PeftModel.from_pretrained(tiny_llama(), dirs["a1"], adapter_name="a1")
    for name in ("a2", "a3"):
        peft.load_adapter(dirs[name], adapter_name=name)
    peft.eval()
    spec = BaseModelSpec.from_dir(base_dir)
    loaded = {name: load_adapter(d, base=spec) for name, d in dirs.items()}
    model = LlamaModel(
        load_model_config(base_dir), load_state_dict(base_dir), fp8=False, dtype=torch.float32
    )
    slab = AdapterSlab(spec, num_slots=4, max_rank=16, max_cpu_loras=0, loader=loaded.__getitem__)
    slots = {name: slab.acquire(name) for name in loaded}
    yield model, peft, slab, slots
    slab.close()


def test_mixed_batch_matches_peft(setup):
    model, peft, slab, slots = setup
    names = ["a1", "__base__", "a2", "a3", "__base__", "a2", "a1"]
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 100, (len(names), 10), generator=gen)
    with torch.no_grad():
        want = peft(tokens, adapter_names=names).logits.double()  # [rows, L, vocab]
        with peft.disable_adapter():
            base = peft(tokens).logits.double()
    seqs = [Seq(t.tolist(), slot=slots.get(n, -1)) for t, n in zip(tokens, names)]
    kv = model.allocate_kv(num_blocks=64, block_size=BLOCK)
    got = (
        model.forward(plan_step(step_for(seqs, BLOCK, BlockPool(64)), kv, slab))
        .double()
        .view(len(names), 10, -1)
    )
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for i, n in enumerate(names):
        if n == "__base__":
            torch.testing.assert_close(got[i], base[i], rtol=1e-4, atol=1e-4)
        else:  # the adapter really changed this row
            assert (got[i] - base[i]).abs().max() > 1e-2


@pytest.mark.parametrize("checks", ["1", "0"])
def test_decode_steps_keep_each_rows_adapter(setup, checks, monkeypatch):
    """Both ways a decode step's LoRA runs: the checked public ops in every layer, and the
    serving path (on this CPU, the compiled decode kernel where it builds)."""
    monkeypatch.setenv("LORASERVE_CHECKS", checks)
    model, peft, slab, slots = setup
    names = ["a3", "__base__", "a1"]
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 100, (3, 6), generator=gen)
    seqs = [Seq(t.tolist(), slot=slots.get(n, -1)) for t, n in zip(tokens, names)]
    kv, pool = model.allocate_kv(num_blocks=64, block_size=BLOCK), BlockPool(64)
    model.forward(plan_step(step_for(seqs, BLOCK, pool, all_logits=False), kv, slab))
    for _ in range(2):
        nxt = torch.randint(0, 100, (3, 1), generator=gen)
        tokens = torch.cat([tokens, nxt], dim=1)
        for s, t in zip(seqs, nxt):
            s.tokens.append(int(t))
        got = model.forward(
            plan_step(step_for(seqs, BLOCK, pool, all_logits=False), kv, slab)
        ).double()
        with torch.no_grad():
            want = peft(tokens, adapter_names=names).logits[:, -1].double()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
