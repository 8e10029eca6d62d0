"""Gemma 3 4B and up are published multimodal (Gemma3ForConditionalGeneration): their
language model is served for text, and their LoRA adapters with it, against transformers +
PEFT on the whole model given text alone. LoRA on the vision tower is skipped, with a note."""

import copy

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    SiglipVisionConfig,
)

from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from serving.model.checkpoint import load_state_dict
from serving.model.gemma_config import text_weights
from serving.model.hf_config import load_model_config
from serving.model.llama import LlamaModel
from serving.model.loader import load_model
from serving.model.step_plan import plan_step
from tests.serving.model.hf_folders import save_tokenizer
from tests.serving.model.steps import BlockPool, Seq, step_for

BLOCK = 4
TEXT = dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=256,
            sliding_window=5, layer_types=["sliding_attention", "full_attention"])  # fmt: skip
VISION = dict(hidden_size=32, intermediate_size=40, num_hidden_layers=1, num_attention_heads=2,
              image_size=28, patch_size=14)  # fmt: skip
ADAPTERS = {  # name: the modules it targets (PEFT's regex on the full module name, or a list)
    "text": r".*language_model.*\.(q_proj|v_proj|down_proj)",
    "all": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3-mm")
    torch.manual_seed(0)
    config = Gemma3Config(text_config=Gemma3TextConfig(**TEXT).to_dict(),
                          vision_config=SiglipVisionConfig(**VISION).to_dict(),
                          mm_tokens_per_image=4, image_token_index=5, boi_token_index=6,
                          eoi_token_index=7)  # fmt: skip
    hf = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # norms away from their zero init, so (1 + w) shows
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(root / "base")
    save_tokenizer(root / "base", "byte_level_bpe")  # load_model reads one
    dirs = {}
    for i, (name, targets) in enumerate(ADAPTERS.items()):
        peft = get_peft_model(copy.deepcopy(hf), LoraConfig(r=4, lora_alpha=8,
                                                            target_modules=targets))  # fmt: skip
        gen = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for pname, p in peft.named_parameters():
                if "lora_" in pname:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
        peft.save_pretrained(root / name)
        dirs[name] = root / name
    peft = PeftModel.from_pretrained(copy.deepcopy(hf), dirs["text"], adapter_name="text")
    peft.load_adapter(dirs["all"], adapter_name="all")
    return root / "base", hf, peft.eval(), dirs


def test_its_language_model_serves_text_as_transformers_does(setup):
    base_dir, hf, _, _ = setup
    config = load_model_config(base_dir)
    assert config.architecture == "Gemma3ForConditionalGeneration" and config.sliding_window == 5
    model = LlamaModel(config, load_state_dict(base_dir), fp8=False, dtype=torch.float32)
    tokens = torch.randint(8, 211, (1, 13), generator=torch.Generator().manual_seed(1))
    kv = model.allocate_kv(num_blocks=32, block_size=BLOCK)
    got = model.forward(plan_step(step_for([Seq(tokens[0].tolist())], BLOCK, BlockPool(32)), kv))
    with torch.no_grad():
        want = hf(tokens).logits[0].double()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_its_adapters_per_row_match_peft(setup):
    base_dir, _, peft, dirs = setup
    spec = BaseModelSpec.from_dir(base_dir)
    loaded = {name: load_adapter(d, base=spec) for name, d in dirs.items()}
    assert any("vision tower" in w for w in loaded["all"].warnings)  # all-linear reached it
    model = LlamaModel(load_model_config(base_dir), load_state_dict(base_dir), fp8=False,
                       dtype=torch.float32)  # fmt: skip
    slab = AdapterSlab(spec, num_slots=4, max_rank=8, max_cpu_loras=0, loader=loaded.__getitem__)
    slots = {name: slab.acquire(name) for name in loaded}
    names = ["text", "__base__", "all", "text"]
    tokens = torch.randint(8, 211, (4, 9), generator=torch.Generator().manual_seed(2))
    seqs = [Seq(t.tolist(), slot=slots.get(n, -1)) for t, n in zip(tokens, names)]
    kv = model.allocate_kv(num_blocks=64, block_size=BLOCK)
    got = model.forward(plan_step(step_for(seqs, BLOCK, BlockPool(64)), kv, slab))
    with torch.no_grad():
        want = peft(input_ids=tokens, adapter_names=names).logits.double()
    torch.testing.assert_close(got.double().view(4, 9, -1), want, rtol=1e-4, atol=1e-4)
    slab.close()


def test_the_loader_serves_it_as_the_model_does(setup):
    base_dir, hf, _, _ = setup
    loaded = load_model(base_dir, quantization="none", dtype="float32", device="cpu")
    state = load_state_dict(base_dir)
    text = text_weights(state, loaded.config.text_prefixes)  # what the loader keeps
    assert any("vision_tower" in name for name in state)
    assert not any("vision" in name for name in text) and "model.norm.weight" in text
    assert text_weights(text, loaded.config.text_prefixes) is text  # already renamed: as it is
    tokens = [9, 17, 33, 4, 120]
    kv = loaded.model.allocate_kv(num_blocks=16, block_size=BLOCK)
    got = loaded.model.forward(plan_step(step_for([Seq(tokens)], BLOCK, BlockPool(16)), kv))
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0].double()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
