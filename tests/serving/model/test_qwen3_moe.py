"""Qwen3-MoE with a different LoRA adapter per row, on attention and on every expert, against
transformers + PEFT (target_parameters on the stacked experts): prefill and decode logits per
row, greedy generation token for token, the per-expert layout (transformers 4's, vLLM's)
equal to the stacked one, FP8 experts, and the refusals."""

import copy
import json

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file

from adapters.errors import AdapterError
from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from serving.model.checkpoint import load_state_dict
from serving.model.errors import ModelLoadError
from serving.model.hf_config import load_model_config, parse_model_config
from serving.model.llama import LlamaModel
from serving.model.moe import ExpertWeights, sparse_mlp
from serving.model.step_plan import plan_step
from tests.serving.model.hf_models import save_tiny
from tests.serving.model.steps import BlockPool, Seq, step_for

BLOCK = 4
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
ADAPTERS = {  # name: (rank, target_modules, target_parameters)
    "attn": (8, ["q_proj", "v_proj"], []),
    "experts": (4, ["q_proj", "o_proj"], [*EXPERTS, "mlp.gate.weight"]),  # the router too
    "down": (8, ["k_proj"], ["mlp.experts.down_proj"]),
}


def save_moe_adapter(path, hf, rank, modules, params, seed):
    """A random PEFT LoRA on hf (a copy), saved to path; returns path."""
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=modules,
                        target_parameters=params or None)  # fmt: skip
    model = get_peft_model(copy.deepcopy(hf), config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    base_dir, hf = save_tiny("qwen3_moe", root / "base")
    dirs = {name: save_moe_adapter(root / name, hf, r, m, p, seed=i + 1)
            for i, (name, (r, m, p)) in enumerate(ADAPTERS.items())}  # fmt: skip
    spec = BaseModelSpec.from_dir(base_dir)
    loaded = {name: load_adapter(d, base=spec) for name, d in dirs.items()}
    model = LlamaModel(load_model_config(base_dir), load_state_dict(base_dir), fp8=False,
                       dtype=torch.float32)  # fmt: skip
    slab = AdapterSlab(spec, num_slots=4, max_rank=8, page_rank=4, max_cpu_loras=0,
                       loader=loaded.__getitem__)  # fmt: skip
    slots = {name: slab.acquire(name) for name in loaded}
    yield base_dir, hf, dirs, model, slab, slots
    slab.close()


def peft_logits(hf, dirs, name, tokens):
    """transformers + PEFT's logits of tokens under adapter name alone (or the base)."""
    with torch.no_grad():
        if name == "__base__":
            return hf(tokens).logits.double()
        peft = PeftModel.from_pretrained(copy.deepcopy(hf), dirs[name]).eval()
        return peft(tokens).logits.double()


def test_config_reads_the_sparse_mlp(setup):
    config = load_model_config(setup[0])
    assert (config.num_experts, config.experts_per_token, config.moe_intermediate_size) == (
        6,
        2,
        24,
    )
    assert config.norm_topk_prob and config.qk_norm


def test_mixed_rows_match_peft_in_prefill_and_decode(setup):
    _, hf, dirs, model, slab, slots = setup
    names = ["experts", "__base__", "attn", "down", "experts"]
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 200, (len(names), 7), generator=gen)
    seqs = [Seq(t.tolist(), slot=slots.get(n, -1)) for t, n in zip(tokens, names)]
    kv, pool = model.allocate_kv(num_blocks=64, block_size=BLOCK), BlockPool(64)
    got = model.forward(plan_step(step_for(seqs, BLOCK, pool), kv, slab)).double()
    got = got.view(len(names), 7, -1)
    base = peft_logits(hf, dirs, "__base__", tokens)
    for i, n in enumerate(names):
        want = peft_logits(hf, dirs, n, tokens[i : i + 1])[0]
        torch.testing.assert_close(got[i], want, rtol=1e-4, atol=1e-4)
        assert n == "__base__" or (got[i] - base[i]).abs().max() > 1e-2
    for _ in range(2):
        nxt = torch.randint(0, 200, (len(names), 1), generator=gen)
        tokens = torch.cat([tokens, nxt], dim=1)
        for s, t in zip(seqs, nxt):
            s.tokens.append(int(t))
        got = model.forward(plan_step(step_for(seqs, BLOCK, pool, all_logits=False), kv, slab))
        for i, n in enumerate(names):
            want = peft_logits(hf, dirs, n, tokens[i : i + 1])[0, -1]
            torch.testing.assert_close(got[i].double(), want, rtol=1e-4, atol=1e-4)


def test_an_expert_adapter_reaches_each_expert_by_its_own_rows(setup):
    """Only the expert LoRA differs between two adapters: each row's output is its own."""
    _, hf, dirs, model, slab, slots = setup
    tokens = torch.randint(0, 200, (2, 9), generator=torch.Generator().manual_seed(5))
    seqs = [Seq(tokens[0].tolist(), slot=slots["down"]), Seq(tokens[1].tolist())]
    kv, pool = model.allocate_kv(num_blocks=32, block_size=BLOCK), BlockPool(32)
    got = model.forward(plan_step(step_for(seqs, BLOCK, pool), kv, slab)).double().view(2, 9, -1)
    torch.testing.assert_close(got[0], peft_logits(hf, dirs, "down", tokens[:1])[0],
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    torch.testing.assert_close(got[1], peft_logits(hf, dirs, "__base__", tokens[1:])[0],
                               rtol=1e-4, atol=1e-4)  # fmt: skip


def test_greedy_generation_matches_transformers_token_for_token(setup):
    _, hf, _dirs, model, _slab, _slots = setup
    prompt = torch.tensor([[5, 17, 99, 3, 42]])
    with torch.no_grad():
        want = hf.generate(prompt, max_new_tokens=12, do_sample=False)[0, 5:].tolist()
    seq = Seq(prompt[0].tolist())
    kv, pool = model.allocate_kv(num_blocks=64, block_size=BLOCK), BlockPool(64)
    got = []
    for _ in range(12):
        logits = model.forward(plan_step(step_for([seq], BLOCK, pool, all_logits=False), kv))
        got.append(int(logits[-1].argmax()))
        seq.tokens.append(got[-1])
    assert got == want


def per_expert_copy(src, dst, num_experts):
    """The stacked adapter at src rewritten one module per expert (transformers 4's layout)."""
    dst.mkdir()
    config = json.loads((src / "adapter_config.json").read_text())
    tensors, out = load_file(src / "adapter_model.safetensors"), {}
    for name, t in tensors.items():
        if ".mlp.experts." not in name:
            out[name] = t
            continue
        prefix, part = name.split(".mlp.experts.")
        which = part.removeprefix("base_layer.")[: len("lora_A")]
        a_name = name.replace("lora_B", "lora_A")
        a = tensors[a_name]
        rank = a.shape[0] // num_experts
        projs = ["gate_proj", "up_proj"] if a.shape[1] == 48 else ["down_proj"]
        b = tensors[a_name.replace("lora_A", "lora_B")].reshape(-1, rank, num_experts)
        rows = b.shape[0] // len(projs)
        for e in range(num_experts):
            for j, proj in enumerate(projs):
                key = f"{prefix}.mlp.experts.{e}.{proj}.{which}.weight"
                if which == "lora_A":
                    out[key] = a.reshape(num_experts, rank, -1)[e].clone()
                else:
                    out[key] = b[j * rows : (j + 1) * rows, :, e].clone()
    config["target_modules"] += ["gate", "gate_proj", "up_proj", "down_proj"]  # routers: linears
    config["target_parameters"] = None
    (dst / "adapter_config.json").write_text(json.dumps(config))
    save_file(out, dst / "adapter_model.safetensors")
    return dst


def test_the_per_expert_layout_reads_as_the_stacked_one(setup, tmp_path):
    base_dir, _, dirs, *_ = setup
    spec = BaseModelSpec.from_dir(base_dir)
    stacked = load_adapter(dirs["experts"], base=spec)
    per = load_adapter(per_expert_copy(dirs["experts"], tmp_path / "per", 6), base=spec)
    assert set(per.modules) == set(stacked.modules)
    assert (2, "experts.5.up_proj") not in per.modules and (1, "experts.5.up_proj") in per.modules
    for key, m in stacked.modules.items():
        torch.testing.assert_close(per.modules[key].a, m.a)
        torch.testing.assert_close(per.modules[key].b, m.b)


def test_fp8_experts_stay_near_the_checkpoint(setup):
    base_dir, _, _, model, slab, slots = setup
    fp8 = LlamaModel(load_model_config(base_dir), load_state_dict(base_dir), fp8=True,
                     dtype=torch.float32)  # fmt: skip
    assert fp8.layers[0].experts.gate_up.dtype == torch.float8_e4m3fn
    tokens = [[3, 14, 15, 92, 65, 35]]
    outs = []
    for m in (model, fp8):
        seqs = [Seq(tokens[0], slot=slots["experts"])]
        kv = m.allocate_kv(num_blocks=16, block_size=BLOCK)
        outs.append(m.forward(plan_step(step_for(seqs, BLOCK, BlockPool(16)), kv, slab)))
    err = (outs[0] - outs[1]).abs().max() / outs[0].abs().max()
    assert 0 < err < 0.3  # routing amplifies FP8's error: a near tie may pick another expert
    # The experts themselves compute with exactly their dequantized weights, LoRA and all.
    w = fp8.layers[0].experts
    served = lambda proj: torch.stack([w.served_weight(e, proj) for e in range(6)])  # noqa: E731
    gate_up = torch.cat([served("gate_proj"), served("up_proj")], dim=1)  # [E, 2 I, hidden]
    exact = ExpertWeights(w.router, gate_up, None, served("down_proj"), None)
    x = torch.randn(5, 48, generator=torch.Generator().manual_seed(2))
    step = plan_step(step_for([Seq([1] * 5, slot=slots["experts"])], BLOCK, BlockPool(4)),
                     fp8.allocate_kv(num_blocks=4, block_size=BLOCK), slab)  # fmt: skip
    args = (
        0,
        fp8.config,
        fp8.act,
        slab,
        step.lora,
        torch.full((5,), slots["experts"], dtype=torch.int32),
    )
    torch.testing.assert_close(sparse_mlp(x, w, *args), sparse_mlp(x, exact, *args),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_refusals_name_what_is_missing(setup, tmp_path):
    base_dir, _, dirs, *_ = setup
    raw = json.loads((base_dir / "config.json").read_text())
    for key, value, says in (("mlp_only_layers", [0], "mlp_only_layers"),
                             ("decoder_sparse_step", 2, "decoder_sparse_step"),
                             ("num_experts_per_tok", 9, "exceeds num_experts")):  # fmt: skip
        with pytest.raises(ModelLoadError, match=says):
            parse_model_config({**raw, key: value})
    dense_dir, _ = save_tiny("qwen3", tmp_path / "dense")
    with pytest.raises(AdapterError, match="has no experts"):
        load_adapter(dirs["experts"], base=BaseModelSpec.from_dir(dense_dir))
    with pytest.raises(AdapterError, match="needs a mixture-of-experts base"):
        load_adapter(dirs["experts"])


@pytest.mark.gpu
def test_on_the_gpu_a_sparse_model_runs_eagerly_as_the_cpu_does(setup):
    """Its routing is read back every layer, so no CUDA graph is captured; the Triton expert
    kernels' logits equal the CPU's."""
    from serving.engine.runner import Forward
    from serving.model.step_plan import StepSeq, build_step

    base_dir, _, dirs, cpu, slab, slots = setup
    state = {k: v.cuda() for k, v in load_state_dict(base_dir).items()}
    model = LlamaModel(load_model_config(base_dir), state, fp8=False, dtype=torch.float32)
    assert not model.graphable
    spec = BaseModelSpec.from_dir(base_dir)
    adapter = load_adapter(dirs["experts"], base=spec)
    gpu_slab = AdapterSlab(spec, num_slots=4, max_rank=8, page_rank=4, max_cpu_loras=0,
                           loader=lambda _: adapter, device="cuda")  # fmt: skip
    forward = Forward(model, 16, BLOCK, gpu_slab, cuda_graphs=True, max_context=64, max_batch=4)
    assert forward.graphs is None
    step = build_step([StepSeq([5, 6, 7, 8, 9], 0, [0, 1], gpu_slab.acquire("experts"))], BLOCK)
    got = forward(step).cpu()
    kv = cpu.allocate_kv(num_blocks=16, block_size=BLOCK)
    want = cpu.forward(
        plan_step(
            build_step([StepSeq([5, 6, 7, 8, 9], 0, [0, 1], slots["experts"])], BLOCK), kv, slab
        )
    )
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    gpu_slab.close()


def served_logits(base_dir, adapter_dir, tokens):
    """Our logits of tokens [1, n] under the adapter at adapter_dir, alone in its step."""
    spec = BaseModelSpec.from_dir(base_dir)
    adapter = load_adapter(adapter_dir, base=spec)
    model = LlamaModel(load_model_config(base_dir), load_state_dict(base_dir), fp8=False,
                       dtype=torch.float32)  # fmt: skip
    slab = AdapterSlab(spec, num_slots=2, max_rank=8, max_cpu_loras=0, loader=lambda _: adapter)
    seqs = [Seq(tokens[0].tolist(), slot=slab.acquire("a"))]
    kv = model.allocate_kv(num_blocks=8, block_size=BLOCK)
    out = model.forward(plan_step(step_for(seqs, BLOCK, BlockPool(8)), kv, slab)).double()
    slab.close()
    return out


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3"])
def test_parameters_targeted_as_parameters_take_their_own_patterns(family, tmp_path):
    """A 2-D parameter PEFT targets by target_parameters (a router, or a dense q_proj) is a
    linear's LoRA, its rank and alpha patterns matched by the parameter's name."""
    base_dir, hf = save_tiny(family, tmp_path / "base")
    param = "mlp.gate.weight" if family == "qwen3_moe" else "self_attn.q_proj.weight"
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["o_proj"], target_parameters=[param],
                        rank_pattern={param: 2}, alpha_pattern={param: 64})  # fmt: skip
    peft = get_peft_model(copy.deepcopy(hf), config)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 0.2)
    peft.save_pretrained(tmp_path / "a")
    tokens = torch.tensor([[4, 8, 15, 16, 23, 42]])
    with torch.no_grad():
        want = PeftModel.from_pretrained(copy.deepcopy(hf), tmp_path / "a")(tokens).logits
    got = served_logits(base_dir, tmp_path / "a", tokens)
    torch.testing.assert_close(got, want[0].double(), rtol=1e-4, atol=1e-4)
