"""Phi-3 (q/k/v and gate/up stored fused) with a different LoRA adapter per row, against
transformers + PEFT, each row under its own adapter: adapters on the fused modules, split into their
parts, and an adapter trained on the unfused names of the same model in Llama's layout
(and a fused one served on that twin)."""

import copy

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from adapters.errors import AdapterError
from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from serving.model.checkpoint import load_state_dict
from serving.model.hf_config import load_model_config
from serving.model.llama import LlamaModel
from serving.model.quantize import quantize_checkpoint
from serving.model.step_plan import plan_step
from tests.adapters.peft_models import save_peft_adapter
from tests.serving.model.hf_models import save_tiny
from tests.serving.model.steps import BlockPool, Seq, step_for

BLOCK = 4
FUSED = {  # name: rank, target modules, extra LoraConfig fields
    "qkv": (8, ("qkv_proj",), {}),
    "all": (4, ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"), {"lora_bias": True}),
    "dora": (4, ("qkv_proj", "gate_up_proj"), {"use_dora": True}),
}
UNFUSED = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def llama_twin(phi3) -> LlamaForCausalLM:
    """The same model in Llama's layout: the fused weights split into their parts."""
    c = phi3.config
    twin = LlamaForCausalLM(LlamaConfig(
        hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, vocab_size=c.vocab_size,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=False,
    ))  # fmt: skip
    state = {}
    q = c.num_attention_heads * (c.hidden_size // c.num_attention_heads)
    kv = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    for name, t in phi3.state_dict().items():
        if "qkv_proj" in name:
            for part, rows in zip(("q_proj", "k_proj", "v_proj"), t.split([q, kv, kv])):
                state[name.replace("qkv_proj", part)] = rows
        elif "gate_up_proj" in name:
            for part, rows in zip(("gate_proj", "up_proj"), t.chunk(2)):
                state[name.replace("gate_up_proj", part)] = rows
        else:
            state[name] = t
    twin.load_state_dict(state)
    return twin.eval()


def ours(base_dir, dirs):
    spec = BaseModelSpec.from_dir(base_dir)
    loaded = {name: load_adapter(d, base=spec) for name, d in dirs.items()}
    model = LlamaModel(
        load_model_config(base_dir), load_state_dict(base_dir), fp8=False, dtype=torch.float32
    )
    slab = AdapterSlab(spec, num_slots=4, max_rank=16, max_cpu_loras=0,
                       loader=loaded.__getitem__, base_weight=model.served_weight)  # fmt: skip
    return model, slab, {name: slab.acquire(name) for name in loaded}


def peft_of(hf, dirs):
    names = list(dirs)
    peft = PeftModel.from_pretrained(copy.deepcopy(hf), dirs[names[0]], adapter_name=names[0])
    for name in names[1:]:
        peft.load_adapter(dirs[name], adapter_name=name)
    return peft.eval()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("phi3")
    phi3_dir, phi3 = save_tiny("phi3", root / "base")
    twin = llama_twin(phi3)
    twin.save_pretrained(root / "twin")
    fused = {
        name: save_peft_adapter(root / name, rank=r, modules=m, seed=i + 1,
                                base=copy.deepcopy(phi3), **extra)[0]
        for i, (name, (r, m, extra)) in enumerate(FUSED.items())
    }  # fmt: skip
    unfused = {"unfused": save_peft_adapter(root / "unfused", rank=8, modules=UNFUSED, seed=9,
                                            base=copy.deepcopy(twin))[0]}  # fmt: skip
    yield {"phi3": phi3, "phi3_dir": phi3_dir, "twin": twin, "twin_dir": root / "twin",
           "fused": fused, "unfused": unfused}  # fmt: skip


def reference(peft, names, tokens):
    """Each row under its own adapter, one adapter at a time (PEFT mixes no DoRA in a batch)."""
    rows = []
    with torch.no_grad():
        for row, name in zip(tokens, names):
            if name == "__base__":
                with peft.disable_adapter():
                    rows.append(peft(row[None]).logits[0].double())
            else:
                peft.set_adapter(name)
                rows.append(peft(row[None]).logits[0].double())
    return torch.stack(rows)


def mixed(model, slab, slots, names, tokens):
    seqs = [Seq(t.tolist(), slot=slots.get(n, -1)) for t, n in zip(tokens, names)]
    kv = model.allocate_kv(num_blocks=64, block_size=BLOCK)
    got = model.forward(plan_step(step_for(seqs, BLOCK, BlockPool(64)), kv, slab))
    return got.double().view(len(names), tokens.shape[1], -1)


@pytest.mark.parametrize("served_on", ["phi3", "twin"])
def test_fused_adapters_per_row_match_peft(world, served_on):
    """On Phi-3 itself, and on its Llama-layout twin: the split is exact either way."""
    model, slab, slots = ours(world[f"{served_on}_dir"], world["fused"])
    peft = peft_of(world["phi3"], world["fused"])
    names = ["qkv", "__base__", "all", "dora", "qkv", "all"]
    tokens = torch.randint(0, 200, (len(names), 9), generator=torch.Generator().manual_seed(0))
    want = reference(peft, names, tokens)
    base = reference(peft, ["__base__"] * len(names), tokens)
    got = mixed(model, slab, slots, names, tokens)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for i, n in enumerate(names):
        assert n == "__base__" or (got[i] - base[i]).abs().max() > 1e-2
    slab.close()


def test_an_adapter_on_the_unfused_names_serves_on_phi3(world):
    model, slab, slots = ours(world["phi3_dir"], world["unfused"])
    peft = peft_of(world["twin"], world["unfused"])
    names = ["unfused", "__base__", "unfused"]
    tokens = torch.randint(0, 200, (3, 9), generator=torch.Generator().manual_seed(1))
    want = reference(peft, names, tokens)
    torch.testing.assert_close(mixed(model, slab, slots, names, tokens), want, rtol=1e-4,
                               atol=1e-4)  # fmt: skip
    slab.close()


def test_a_fused_module_needs_the_base_and_may_not_repeat_its_parts(world, tmp_path):
    with pytest.raises(AdapterError, match="qkv_proj is a fused module"):
        load_adapter(world["fused"]["qkv"])
    both = save_peft_adapter(tmp_path / "both", rank=4, modules=("qkv_proj",), seed=3,
                             base=copy.deepcopy(world["phi3"]))[0]  # fmt: skip
    extra = save_peft_adapter(tmp_path / "q", rank=4, modules=("q_proj",), seed=4,
                              base=copy.deepcopy(world["twin"]))[0]  # fmt: skip
    from safetensors.torch import load_file, save_file

    merged = {**load_file(both / "adapter_model.safetensors"),
              **load_file(extra / "adapter_model.safetensors")}  # fmt: skip
    save_file(merged, both / "adapter_model.safetensors")
    config = (
        (both / "adapter_config.json").read_text().replace('"qkv_proj"', '"qkv_proj", "q_proj"')
    )
    (both / "adapter_config.json").write_text(config)
    with pytest.raises(AdapterError, match="adapted both on its own and within qkv_proj"):
        load_adapter(both, base=BaseModelSpec.from_dir(world["phi3_dir"]))


def test_fp8_checkpoint_of_phi3_splits_its_scales_with_its_rows(world, tmp_path):
    """`loraserve quantize` writes the fused linears in FP8 with a scale per row; loaded, they
    split into the same parts, scales alike, as quantizing on the fly does."""
    quantize_checkpoint(world["phi3_dir"], tmp_path / "fp8", show_progress=False)
    state = load_state_dict(tmp_path / "fp8")
    assert state["model.layers.0.self_attn.qkv_proj.weight"].dtype == torch.float8_e4m3fn
    prequantized = LlamaModel(load_model_config(tmp_path / "fp8"), state, fp8=True,
                              dtype=torch.float32)  # fmt: skip
    on_the_fly = LlamaModel(load_model_config(world["phi3_dir"]),
                            load_state_dict(world["phi3_dir"]), fp8=True, dtype=torch.float32)  # fmt: skip
    logits = []
    for model in (prequantized, on_the_fly):
        seqs = [Seq([3, 1, 4, 1, 5, 9, 2, 6])]
        logits.append(
            model.forward(plan_step(step_for(seqs, BLOCK, BlockPool(8)), model.allocate_kv(8, 4)))
        )
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0)


def test_an_all_linear_adapter_keeps_its_fused_modules(world, tmp_path):
    """PEFT expands all-linear on Phi-3 to qkv_proj, o_proj, gate_up_proj, down_proj."""
    peft_model = get_peft_model(copy.deepcopy(world["phi3"]),
                                LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))  # fmt: skip
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # PEFT starts B at zero
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(5)) * 0.1)
    peft_model.save_pretrained(tmp_path / "all")
    path = tmp_path / "all"
    adapter = load_adapter(path, base=BaseModelSpec.from_dir(world["phi3_dir"]))
    assert {m for _, m in adapter.modules} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}  # fmt: skip
    model, slab, slots = ours(world["phi3_dir"], {"all": path})
    peft = peft_of(world["phi3"], {"all": path})
    tokens = torch.randint(0, 200, (2, 9), generator=torch.Generator().manual_seed(6))
    want = reference(peft, ["all", "__base__"], tokens)
    got = mixed(model, slab, slots, ["all", "__base__"], tokens)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    slab.close()
