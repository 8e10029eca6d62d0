"""Rank 256, the highest lora.max_lora_rank we test: a rank-256 adapter (plain and DoRA) loads
into a rank-256 slab and matches PEFT's logits beside base rows; rank 257 is refused by name."""

import pytest
import torch
from peft import PeftModel

from adapters.errors import AdapterError
from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from serving.config import LoraSection
from serving.model.checkpoint import load_state_dict
from serving.model.hf_config import load_model_config
from serving.model.llama import LlamaModel
from serving.model.step_plan import plan_step
from tests.adapters.peft_models import save_base, save_peft_adapter, tiny_llama
from tests.serving.model.steps import BlockPool, Seq, step_for

MAX_RANK, BLOCK = 256, 4
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTERS = {"plain": {}, "dora": {"use_dora": True}}  # both rank 256 on every module


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("rank256")
    base_dir = save_base(root / "base")
    dirs = {
        name: save_peft_adapter(root / name, rank=MAX_RANK, modules=ALL, seed=i + 1, **kw)[0]
        for i, (name, kw) in enumerate(ADAPTERS.items())
    }
    peft = PeftModel.from_pretrained(tiny_llama(), dirs["plain"], adapter_name="plain")
    peft.load_adapter(dirs["dora"], adapter_name="dora")
    peft.eval()
    spec = BaseModelSpec.from_dir(base_dir)
    loaded = {n: load_adapter(d, base=spec, max_rank=MAX_RANK) for n, d in dirs.items()}
    model = LlamaModel(
        load_model_config(base_dir), load_state_dict(base_dir), fp8=False, dtype=torch.float32
    )
    slab = AdapterSlab(
        spec, num_slots=2, max_rank=MAX_RANK, max_cpu_loras=0, loader=loaded.__getitem__,
        base_weight=model.served_weight,
    )  # fmt: skip
    slots = {name: slab.acquire(name) for name in loaded}
    yield root, model, peft, slab, slots, loaded
    slab.close()


def test_a_rank_256_limit_is_a_valid_config():
    assert LoraSection(max_lora_rank=MAX_RANK).max_lora_rank == MAX_RANK


def test_rank_256_adapters_load_whole(setup):
    *_, slab, slots, loaded = setup
    for name, adapter in loaded.items():
        assert adapter.rank == MAX_RANK and adapter.modules[1, "down_proj"].a.shape[0] == MAX_RANK
        assert int(slab.ranks[slots[name]]) == MAX_RANK


def test_rank_256_matches_peft_beside_base_rows(setup):
    _, model, peft, slab, slots, _ = setup
    names = ["plain", None, "dora", "plain", None]
    tokens = torch.randint(0, 100, (len(names), 7), generator=torch.Generator().manual_seed(0))
    want = []
    with torch.no_grad():
        for row, name in zip(tokens, names):
            if name is None:
                with peft.disable_adapter():
                    want.append(peft(row[None]).logits[0].double())
            else:
                peft.set_adapter(name)
                want.append(peft(row[None]).logits[0].double())
        with peft.disable_adapter():
            base = peft(tokens).logits.double()
    seqs = [Seq(t.tolist(), slot=slots[n] if n else -1) for t, n in zip(tokens, names)]
    kv = model.allocate_kv(num_blocks=32, block_size=BLOCK)
    got = model.forward(plan_step(step_for(seqs, BLOCK, BlockPool(32)), kv, slab)).double()
    got = got.view(len(names), tokens.shape[1], -1)
    torch.testing.assert_close(got, torch.stack(want), rtol=1e-4, atol=1e-4)
    for i, name in enumerate(names):
        if name:  # the rank-256 update really changed the row
            assert (got[i] - base[i]).abs().max() > 1e-2, name


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"rank": MAX_RANK + 1}, "r"),
        ({"rank": 8, "rank_pattern": {"v_proj": MAX_RANK + 1}}, "rank_pattern['v_proj']"),
    ],
    ids=["r", "rank_pattern"],
)
def test_rank_257_is_refused_naming_the_field_and_the_limit(setup, kw, field):
    root, *_ = setup
    folder, _ = save_peft_adapter(root / f"too-big-{field[:4]}", modules=("q_proj", "v_proj"), **kw)
    spec = BaseModelSpec.from_dir(root / "base")
    with pytest.raises(AdapterError) as info:
        load_adapter(folder, base=spec, max_rank=MAX_RANK)
    message = str(info.value)
    assert f"{field}: rank {MAX_RANK + 1} is above lora.max_lora_rank ({MAX_RANK})" in message
