"""lora.slab_mb and lora.host_mb: the bytes a replica gives its adapters, given or auto."""

import pytest
import torch

from adapters.format.base_model import BaseModelSpec
from serving.config import LoraSection, parse_config
from serving.engine import memory_budget
from serving.engine.memory_budget import AdapterMemory, adapter_memory

GIB = 1 << 30
LLAMA_7B = BaseModelSpec.from_config({
    "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
    "num_hidden_layers": 32, "vocab_size": 32000,
})  # fmt: skip


@pytest.fixture
def machine(monkeypatch):
    """A machine of 64 GiB with 16 GiB available and a GPU with 40 GiB free."""
    monkeypatch.setattr(memory_budget, "physical_ram", lambda: 64 * GIB)
    monkeypatch.setattr(memory_budget, "available_ram", lambda: 16 * GIB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (40 * GIB, 80 * GIB))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_sizes_in_mib_are_used_as_given(machine, device):
    cfg = parse_config({"lora": {"slab_mb": 300, "host_mb": 2048}})
    assert adapter_memory(cfg, device) == AdapterMemory(None, 300 << 20, 2 * GIB)


def test_auto_takes_a_share_of_free_gpu_memory_or_available_ram(machine, monkeypatch):
    cfg = parse_config({})
    host = int(64 * GIB * memory_budget.HOST_SHARE)
    gpu = int(40 * GIB * memory_budget.SLAB_GPU_SHARE)
    assert adapter_memory(cfg, "cuda") == AdapterMemory(None, gpu, host)
    cpu = int(16 * GIB * memory_budget.SLAB_CPU_SHARE)
    assert adapter_memory(cfg, "cpu").slab_bytes == min(cpu, memory_budget.SLAB_CPU_CAP_BYTES)
    monkeypatch.setattr(memory_budget, "available_ram", lambda: 1 << 20)
    assert adapter_memory(cfg, "cpu").slab_bytes == int((1 << 20) * memory_budget.SLAB_CPU_SHARE)


def test_max_loras_leaves_the_slab_to_its_count_and_the_host_tier_to_bytes(machine):
    memory = adapter_memory(parse_config({"lora": {"max_loras": 8, "host_mb": 100}}), "cuda")
    assert memory == AdapterMemory(8, None, 100 << 20)


@pytest.mark.parametrize("itemsize", [2, 4])
def test_the_default_host_tier_holds_a_thousand_small_7b_adapters_on_64_gib(machine, itemsize):
    q, v = LLAMA_7B.shapes["q_proj"], LLAMA_7B.shapes["v_proj"]
    one = itemsize * LLAMA_7B.num_layers * 8 * (sum(q) + sum(v))  # rank 8: A [8, in], B [out, 8]
    assert 1000 * one <= adapter_memory(parse_config({}), "cpu").host_bytes


def test_a_container_limit_bounds_the_physical_memory(tmp_path, monkeypatch):
    total = memory_budget.physical_ram()
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    monkeypatch.setattr(memory_budget, "_CGROUP_LIMITS", (v2, v1))
    assert memory_budget.physical_ram() == total  # neither file: the machine's
    v2.write_text("max\n")
    assert memory_budget.physical_ram() == total
    v1.write_text(f"{1 << 62}\n")  # v1's "no limit"
    assert memory_budget.physical_ram() == total
    v2.write_text(f"{GIB}\n")
    assert memory_budget.physical_ram() == min(total, GIB)


def test_a_draft_model_gets_room_for_as_many_companions_as_it_is_given():
    draft = BaseModelSpec.from_config({
        "hidden_size": 2048, "intermediate_size": 5504, "num_attention_heads": 16,
        "num_hidden_layers": 4, "vocab_size": 32000,
    })  # fmt: skip
    ratio = draft.largest_adapter_bytes(16) / LLAMA_7B.largest_adapter_bytes(16)
    assert 0.01 < ratio < 0.1
    scaled = AdapterMemory(None, GIB, 4 * GIB).for_draft(LLAMA_7B, draft, 16, num_slots=40)
    assert scaled == AdapterMemory(40, None, int(4 * GIB * ratio))


def test_the_config_reference_states_the_auto_shares():
    fields = LoraSection.model_fields
    slab, host = fields["slab_mb"].description, fields["host_mb"].description
    assert f"auto = {memory_budget.SLAB_GPU_SHARE:.0%} of the GPU memory free" in slab
    assert f"on a CPU {memory_budget.SLAB_CPU_SHARE:.0%} of the RAM available" in slab
    assert f"at most {memory_budget.SLAB_CPU_CAP_BYTES >> 20} MiB" in slab
    assert f"auto = {memory_budget.HOST_SHARE:.0%} of the machine's physical memory" in host
