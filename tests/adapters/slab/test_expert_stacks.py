"""A mixture-of-experts base's slab: each expert's stacks are views of one tensor per layer and
projection, which the grouped expert kernels read whole, and its bytes are what page_costs
counts."""

from __future__ import annotations

from adapters.format.base_model import BaseModelSpec
from adapters.slab.pages import page_costs
from adapters.slab.slab import AdapterSlab
from tests.adapters.slab.helpers import device_bytes


def test_a_mixture_of_experts_slab_holds_what_page_costs_counts():
    """Each expert's stacks (views of one tensor per layer and projection) and no bias or
    DoRA vectors for them: the bytes counted are the bytes allocated."""
    spec = BaseModelSpec.from_config({
        "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "vocab_size": 50, "num_experts": 5,
    })  # fmt: skip
    assert spec.num_experts == 5 and "experts.4.down_proj" in spec.shapes
    costs = page_costs(spec, max_rank=8, page_rank=4)
    slab = AdapterSlab(spec, max_rank=8, page_rank=4, slab_bytes=costs.bytes_for(6),
                       loader=lambda _: None, max_cpu_loras=0)  # fmt: skip
    assert slab.num_pages == 6 and device_bytes(slab) == costs.bytes_for(6)
    a, b = slab.expert_stacks(1, "up_proj")
    assert a.shape == (5, 6, 8, 32) and b.shape == (5, 6, 8, 16)
    assert slab.lora_a(1, "experts.3.up_proj").data_ptr() == a[3].data_ptr()
    slab.close()
