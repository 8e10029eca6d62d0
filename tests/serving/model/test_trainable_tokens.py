"""PEFT's trainable tokens (trainable_token_indices) served per row beside plain LoRA and base
rows, against PEFT's forward: with a separate LM head, and with one tied to the embedding
(where an adapter's rows are its LM-head rows too)."""

import pytest
import torch
from peft import PeftModel

from adapters.errors import AdapterError
from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from serving.model.checkpoint import load_state_dict
from serving.model.hf_config import load_model_config
from serving.model.llama import LlamaModel
from serving.model.step_plan import plan_step
from tests.adapters.peft_models import save_peft_adapter, tiny_llama
from tests.serving.model.steps import BlockPool, Seq, step_for

BLOCK = 4
IDS = [3, 17, 42, 99]
ROWS = ["tokens", "__base__", "plain", "tokens", "__base__"]


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def setup(request, tmp_path_factory):
    tied = request.param
    root = tmp_path_factory.mktemp("tokens")
    tiny_llama(tie_word_embeddings=tied).save_pretrained(root / "base")
    dirs = {
        "tokens": save_peft_adapter(
            root / "tokens", rank=4, modules=("q_proj",), seed=1,
            base=tiny_llama(tie_word_embeddings=tied), trainable_token_indices=IDS,
        )[0],
        "plain": save_peft_adapter(
            root / "plain", rank=8, modules=("v_proj",), seed=2,
            base=tiny_llama(tie_word_embeddings=tied),
        )[0],
    }  # fmt: skip
    # One PEFT model per adapter: PEFT cannot load a second adapter beside trainable tokens.
    peft = {name: PeftModel.from_pretrained(tiny_llama(tie_word_embeddings=tied), d).eval()
            for name, d in dirs.items()}  # fmt: skip
    spec = BaseModelSpec.from_dir(root / "base")
    loaded = {name: load_adapter(d, base=spec) for name, d in dirs.items()}
    model = LlamaModel(load_model_config(root / "base"), load_state_dict(root / "base"),
                       fp8=False, dtype=torch.float32)  # fmt: skip
    assert (model.lm_head is model.embed) == tied
    slab = AdapterSlab(spec, num_slots=3, max_rank=8, max_cpu_loras=0, loader=loaded.__getitem__,
                       max_tokens=8)  # fmt: skip
    slots = {name: slab.acquire(name) for name in loaded}
    yield model, peft, slab, slots, loaded, spec
    slab.close()


def reference(peft, tokens, names):
    rows = {}
    with torch.no_grad():
        for name in set(names):
            idx = [i for i, n in enumerate(names) if n == name]
            if name == "__base__":
                with peft["plain"].disable_adapter():
                    logits = peft["plain"](tokens[idx]).logits
            else:
                logits = peft[name](tokens[idx]).logits
            for j, i in enumerate(idx):
                rows[i] = logits[j].double()
    return torch.stack([rows[i] for i in range(len(names))])


def test_rows_of_their_own_match_peft(setup):
    model, peft, slab, slots, loaded, _ = setup
    assert loaded["tokens"].variants == ("trainable_token_indices",)
    assert loaded["tokens"].tokens.ids.tolist() == IDS
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 100, (len(ROWS), 8), generator=gen)
    tokens[:, ::2] = torch.tensor(IDS)  # every row meets the adapter's own ids
    want = reference(peft, tokens, ROWS)
    with torch.no_grad(), peft["plain"].disable_adapter():
        base = peft["plain"](tokens).logits.double()
    seqs = [Seq(t.tolist(), slot=slots.get(n, -1)) for t, n in zip(tokens, ROWS)]
    kv = model.allocate_kv(num_blocks=64, block_size=BLOCK)
    got = model.forward(plan_step(step_for(seqs, BLOCK, BlockPool(64)), kv, slab)).double()
    got = got.view(len(ROWS), tokens.shape[1], -1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for i, n in enumerate(ROWS):
        if n == "__base__":  # another row's tokens never leak into a base row
            torch.testing.assert_close(got[i], base[i], rtol=1e-4, atol=1e-4)


def test_refusals_name_the_field(setup):
    _, _, _, _, loaded, spec = setup
    small = AdapterSlab(spec, num_slots=1, max_rank=8, max_cpu_loras=0,
                        loader=loaded.__getitem__, max_tokens=2)  # fmt: skip
    try:
        with pytest.raises(AdapterError, match=r"lora\.max_trainable_tokens"):
            small.acquire("tokens")
    finally:
        small.close()
