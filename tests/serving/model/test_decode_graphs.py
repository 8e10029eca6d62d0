"""Decode steps padded to a graph's batch size: what the padding does, checked on the CPU.

- A decode step padded to the next size gives the logits and the KV cache of the same step
  unpadded; padding rows write only the scratch block.
- The graphs take decode steps only, and only while the slab serves plain LoRA.
- The LoRA and attention Triton kernels (interpreted here) read a padded buffer's fixed
  views, empty segments and padding sequences included, and agree with the float64 oracles
  on the real rows.
The capture and replay themselves are CUDA-only: tests/serving/model/test_graphs_gpu.py.
"""

import pytest
import torch

from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from kernels import HostIndex
from kernels.lora_expand_triton import lora_expand_triton
from kernels.lora_reference import expand_oracle, shrink_oracle
from kernels.lora_shrink_triton import lora_shrink_triton
from kernels.paged_attention_triton import paged_attention_triton
from serving.model.checkpoint import load_state_dict
from serving.model.decode_graphs import DecodeGraphs
from serving.model.hf_config import load_model_config
from serving.model.llama import LlamaModel
from serving.model.padded_decode import Padding, padded_values, static_views
from serving.model.step_plan import plan_step
from tests.adapters.peft_models import save_base, save_peft_adapter
from tests.kernels.attention_oracle import attention_oracle
from tests.serving.model.steps import BlockPool, Seq, step_for

BLOCK, BLOCKS = 4, 64  # block BLOCKS is the scratch block
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("graphs")
    base_dir = save_base(root / "base")
    spec = BaseModelSpec.from_dir(base_dir)
    loaded = {
        name: load_adapter(save_peft_adapter(root / name, rank=r, modules=ALL, seed=i)[0], base=spec)
        for i, (name, r) in enumerate({"a": 8, "b": 4}.items())
    }  # fmt: skip
    model = LlamaModel(
        load_model_config(base_dir), load_state_dict(base_dir), fp8=False, dtype=torch.float32
    )
    slab = AdapterSlab(spec, num_slots=4, max_rank=8, max_cpu_loras=0, loader=loaded.__getitem__)
    slots = {name: slab.acquire(name) for name in loaded}
    yield model, slab, slots
    slab.close()


def prefill_then_decode(slots, names, lengths):
    gen = torch.Generator().manual_seed(0)
    seqs = [
        Seq(torch.randint(0, 100, (n,), generator=gen).tolist(), slot=slots.get(name, -1))
        for name, n in zip(names, lengths)
    ]
    pool = BlockPool(BLOCKS)
    prefill = step_for(seqs, BLOCK, pool, all_logits=False)
    for s in seqs:
        s.tokens.append(int(torch.randint(0, 100, (1,), generator=gen)))
    return prefill, step_for(seqs, BLOCK, pool, all_logits=False)


def test_a_padded_decode_step_gives_the_unpadded_step(setup):
    model, slab, slots = setup
    prefill, decode = prefill_then_decode(slots, ["a", "__base__", "b"], [5, 9, 6])
    kv_eager = model.allocate_kv(BLOCKS + 1, BLOCK)
    kv_graphs = model.allocate_kv(BLOCKS + 1, BLOCK)
    graphs = DecodeGraphs(model, kv_graphs, slab, scratch_block=BLOCKS, block_size=BLOCK,
                          max_context=32, capture=False)  # fmt: skip
    assert graphs.sizes == (1, 2, 4, 8, 16, 32, 64)
    with torch.inference_mode():
        for kv in (kv_eager, kv_graphs):
            model.forward(plan_step(prefill, kv, slab))
        want = model.forward(plan_step(decode, kv_eager, slab))
        assert graphs.covers(decode) and not graphs.covers(prefill)
        got = graphs.forward(decode)  # 3 sequences, run as a batch of 4
    assert got.shape == want.shape == (3, model.config.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for (k_e, v_e), (k_g, v_g) in zip(kv_eager, kv_graphs):
        torch.testing.assert_close(k_g[:BLOCKS], k_e[:BLOCKS], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v_g[:BLOCKS], v_e[:BLOCKS], rtol=1e-5, atol=1e-5)
        assert k_e[BLOCKS].abs().sum() == 0 and k_g[BLOCKS, 0].abs().sum() > 0
        assert k_g[BLOCKS, 1:].abs().sum() == 0  # one padding key, at position 0


def test_the_graphs_take_plain_decode_steps_only(setup, monkeypatch):
    model, slab, slots = setup
    prefill, decode = prefill_then_decode(slots, ["a", "b", "a"], [5, 5, 5])
    kv = model.allocate_kv(BLOCKS + 1, BLOCK)
    make = lambda **kw: DecodeGraphs(model, kv, slab, scratch_block=BLOCKS, block_size=BLOCK,  # noqa: E731
                                     capture=False, **{"max_context": 32, **kw})  # fmt: skip
    assert make().covers(decode)
    assert not make().covers(prefill)
    assert make(max_batch=2).sizes == (1, 2) and not make(max_batch=2).covers(decode)
    assert not make(max_context=4).covers(decode)  # tables wider than the graphs'
    verify = step_for([Seq([1, 2, 3, 4, 5, 6], cached=5)], BLOCK, BlockPool(8), all_logits=True)
    assert make().covers(verify)  # one token, one logits row: a decode
    two = step_for([Seq([1, 2, 3, 4, 5, 6, 7], cached=5)], BLOCK, BlockPool(8), all_logits=True)
    assert not make().covers(two)  # a draft's verification: k + 1 rows
    monkeypatch.setattr(slab.vectors, "num_dora", 1)  # a DoRA adapter is resident
    assert not make().covers(decode)
    monkeypatch.setattr(slab.vectors, "num_dora", 0)
    monkeypatch.setattr(slab, "serves_outer", lambda module: module == "lm_head")
    assert not make().covers(decode)
    no_slab = DecodeGraphs(model, kv, None, scratch_block=BLOCKS, block_size=BLOCK,
                           max_context=32, capture=False)  # fmt: skip
    assert not no_slab.covers(decode)  # adapters, but no slab to serve them


def padded_buffer(n: int, size: int, ranks: list[int], gen):
    """A decode step of n sequences with random adapter slots, padded to size."""
    adapter = torch.randint(-1, len(ranks) - 1, (n,), generator=gen).tolist()  # the last slot empty
    lens = torch.randint(1, 9, (n,), generator=gen).tolist()
    tables = [tuple(torch.randperm(6, generator=gen)[:3].tolist()) for _ in range(n)]
    host = HostIndex(tuple(range(n + 1)), tuple(lens), tuple(t[0] * 4 for t in tables),
                     tuple(tables), tuple(adapter), tuple(range(n)))  # fmt: skip
    values = padded_values(Padding(size, 3, 6, 4), [1] * n, [x - 1 for x in lens], host, ranks)
    return static_views(torch.tensor(values), size, 3), adapter


@pytest.mark.parametrize(("n", "size"), [(1, 1), (3, 4), (5, 8)])
def test_the_lora_kernels_read_a_padded_buffer(n, size):
    gen = torch.Generator().manual_seed(n)
    ranks = [8, 16, 4, 0]
    views, adapter = padded_buffer(n, size, ranks, gen)
    a = torch.randn(4, 16, 24, generator=gen)
    b = torch.randn(4, 16, 40, generator=gen)
    scales = torch.rand(4, generator=gen)
    x = torch.randn(size, 24, generator=gen)
    t = torch.zeros(1, size, 16)
    y = torch.zeros(size, 40)
    segments = views.segments(num_slots=4, max_rank=16)
    lora_shrink_triton(x, (a,), t, segments)
    lora_expand_triton(t, (b,), y, segments, scales)
    slots = torch.tensor(adapter + [-1] * (size - n))
    r = torch.tensor(ranks, dtype=torch.int32)
    want_t = shrink_oracle(x, (a,), slots, r)
    live = ~want_t.isnan()
    torch.testing.assert_close(t[live].double(), want_t[live], rtol=1e-4, atol=1e-4)
    want_y = expand_oracle(torch.zeros(size, 40), want_t.nan_to_num(0.0), (b,), slots, r, scales)
    torch.testing.assert_close(y.double(), want_y, rtol=1e-4, atol=1e-4)
    assert y[n:].abs().sum() == 0  # padding rows are base-only


def test_the_attention_kernel_reads_a_padded_buffer():
    gen = torch.Generator().manual_seed(7)
    views, _ = padded_buffer(3, 4, [8, 8, 8, 0], gen)
    k_cache, v_cache = (torch.randn(7, 4, 2, 16, generator=gen) for _ in range(2))
    q = torch.randn(4, 4, 16, generator=gen)
    f = views.fields
    out = paged_attention_triton(q, k_cache, v_cache, views.block_tables, f["context_lens"],
                                 f["query_starts"], 0.25, max_query_len=1)  # fmt: skip
    want = attention_oracle(q, k_cache, v_cache, views.block_tables, f["context_lens"],
                            f["query_starts"], 0.25)  # fmt: skip
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)  # padding row too
