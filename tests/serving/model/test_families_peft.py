"""Qwen3 (an RMSNorm over each head of q and k before RoPE), Gemma 2 (attention scores
soft-capped) and Gemma 3 ((1 + w) and sandwich norms, GELU, a scaled embedding, sliding
layers with a RoPE of their own, a logit soft-cap)
with a different LoRA adapter per row, against transformers + PEFT's own mixed-batch
forward (`adapter_names`), in a prefill and in the decode steps after it, and greedy
generation token for token. (Phi-3's fused linears: test_phi3.py.)"""

import copy

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
from tests.adapters.peft_models import save_peft_adapter
from tests.serving.model.hf_models import save_tiny
from tests.serving.model.steps import BlockPool, Seq, step_for

BLOCK = 4
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTERS = {"q": (8, ("q_proj", "k_proj")), "all": (4, ALL), "mlp": (16, ("down_proj", "up_proj"))}


@pytest.fixture(scope="module", params=["qwen3", "gemma2", "gemma3"])
def setup(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    base_dir, hf = save_tiny(request.param, root / "base")
    dirs = {
        name: save_peft_adapter(root / name, rank=r, modules=m, seed=i + 1,
                                base=copy.deepcopy(hf))[0]
        for i, (name, (r, m)) in enumerate(ADAPTERS.items())
    }  # fmt: skip
    peft = PeftModel.from_pretrained(copy.deepcopy(hf), dirs["q"], adapter_name="q")
    for name in ("all", "mlp"):
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


def test_mixed_rows_match_peft_in_prefill_and_decode(setup):
    model, peft, slab, slots = setup
    names = ["q", "__base__", "all", "mlp", "all"]
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 200, (len(names), 7), generator=gen)
    seqs = [Seq(t.tolist(), slot=slots.get(n, -1)) for t, n in zip(tokens, names)]
    kv, pool = model.allocate_kv(num_blocks=64, block_size=BLOCK), BlockPool(64)
    got = model.forward(plan_step(step_for(seqs, BLOCK, pool), kv, slab)).double()
    with torch.no_grad():
        want = peft(tokens, adapter_names=names).logits.double()
        with peft.disable_adapter():
            base = peft(tokens).logits.double()
    got = got.view(len(names), 7, -1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for i, n in enumerate(names):  # each adapter really changed its row
        assert n == "__base__" or (got[i] - base[i]).abs().max() > 1e-2
    for _ in range(3):
        nxt = torch.randint(0, 200, (len(names), 1), generator=gen)
        tokens = torch.cat([tokens, nxt], dim=1)
        for s, t in zip(seqs, nxt):
            s.tokens.append(int(t))
        step = step_for(seqs, BLOCK, pool, all_logits=False)
        got = model.forward(plan_step(step, kv, slab)).double()
        with torch.no_grad():
            want = peft(tokens, adapter_names=names).logits[:, -1].double()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_greedy_generation_matches_transformers_token_for_token(setup):
    model, peft, _slab, _slots = setup
    prompt = torch.tensor([[5, 17, 99, 3, 42]])
    with torch.no_grad(), peft.disable_adapter():
        want = peft.generate(prompt, max_new_tokens=12, do_sample=False)[0, 5:].tolist()
    seq = Seq(prompt[0].tolist())
    kv, pool = model.allocate_kv(num_blocks=64, block_size=BLOCK), BlockPool(64)
    got = []
    for _ in range(12):
        logits = model.forward(plan_step(step_for([seq], BLOCK, pool, all_logits=False), kv))
        token = int(logits[-1].argmax())
        got.append(token)
        seq.tokens.append(token)
    assert got == want


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_gemmas_scaled_embedding_scales_the_adapters_rows_too(tmp_path, kind):
    """LoRA on embed_tokens: PEFT scales its rows by Gemma's embedding scale as the base's."""
    base_dir, hf = save_tiny(kind, tmp_path / "base")
    path = save_peft_adapter(tmp_path / "emb", rank=4, modules=("embed_tokens", "q_proj"),
                             seed=3, base=copy.deepcopy(hf))[0]  # fmt: skip
    peft = PeftModel.from_pretrained(copy.deepcopy(hf), path, adapter_name="emb").eval()
    spec = BaseModelSpec.from_dir(base_dir)
    model = LlamaModel(load_model_config(base_dir), load_state_dict(base_dir), fp8=False,
                       dtype=torch.float32)  # fmt: skip
    slab = AdapterSlab(spec, num_slots=2, max_rank=8, max_cpu_loras=0, embeddings=True,
                       loader={"emb": load_adapter(path, base=spec)}.__getitem__)  # fmt: skip
    slot = slab.acquire("emb")
    tokens = torch.randint(0, 200, (2, 7), generator=torch.Generator().manual_seed(4))
    seqs = [Seq(tokens[0].tolist(), slot=slot), Seq(tokens[1].tolist())]
    kv = model.allocate_kv(num_blocks=32, block_size=BLOCK)
    got = model.forward(plan_step(step_for(seqs, BLOCK, BlockPool(32)), kv, slab)).double()
    with torch.no_grad():
        want = peft(tokens, adapter_names=["emb", "__base__"]).logits.double()
    torch.testing.assert_close(got.view(2, 7, -1), want, rtol=1e-4, atol=1e-4)
    slab.close()
