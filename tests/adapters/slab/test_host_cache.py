"""The slab's host tier on its own: LRU by entries and by tensor bytes, and what it refuses."""

import dataclasses
import threading
from collections import Counter

import pytest
import torch

from adapters.format.trainable_tokens import TrainableTokens
from adapters.slab.host_cache import HostCache
from tests.adapters.factory import TINY_SPEC
from tests.adapters.slab.helpers import ALL, Registry, make_adapter


def float32_bytes(rank: int, modules=("q_proj", "v_proj")) -> int:
    """A float32 LoRA's A [r, in] and B [out, r] on every layer, from the base model's shapes."""
    per_layer = sum(rank * sum(TINY_SPEC.shapes[m]) for m in modules)
    return 4 * TINY_SPEC.num_layers * per_layer


def cache(reg: Registry, capacity: int | None, max_bytes: int | None) -> HostCache:
    return HostCache(capacity, reg, lambda v, a: None, lock=threading.Lock(), max_bytes=max_bytes)


def fetch_all(host: HostCache, *versions: str) -> list[str]:
    """Fetch each version in turn: the tier ("host" or "registry") each came from."""
    return [host.fetch(v)[1] for v in versions]


def test_tensor_bytes_counts_every_tensor_it_holds():
    plain = make_adapter(8)
    assert plain.tensor_bytes == float32_bytes(8) == 14_336
    outs = {key: TINY_SPEC.shapes[key[1]][1] for key in plain.modules}
    modules = {
        key: dataclasses.replace(m, bias=torch.zeros(outs[key]), magnitude=torch.ones(outs[key]))
        for key, m in plain.modules.items()
    }
    tokens = TrainableTokens(torch.arange(3), torch.zeros(3, TINY_SPEC.hidden_size))
    draft = make_adapter(4, seed=5)
    full = dataclasses.replace(plain, modules=modules, tokens=tokens, draft=draft)
    extras = 2 * 4 * sum(outs.values()) + 3 * 8 + 3 * TINY_SPEC.hidden_size * 4
    assert full.tensor_bytes == float32_bytes(8) + extras + float32_bytes(4)


def test_bytes_bound_the_tier_and_the_least_recently_used_go():
    reg = Registry(*(make_adapter(8, seed=i) for i in range(3)))
    v0, v1, v2 = reg.versions
    size = float32_bytes(8)
    host = cache(reg, None, max_bytes=2 * size + size // 2)  # room for two
    assert fetch_all(host, v0, v1, v0) == ["registry", "registry", "host"]
    assert (len(host), host.used_bytes, host.evictions) == (2, 2 * size, 0)
    assert fetch_all(host, v2) == ["registry"]  # v1 is the least recently used: it goes
    assert host.versions() == [v0, v2] and host.evictions == 1
    assert fetch_all(host, v0, v2, v1) == ["host", "host", "registry"]
    assert host.versions() == [v2, v1] and host.used_bytes == 2 * size
    assert reg.calls == Counter({v0: 1, v1: 2, v2: 1})


def test_a_large_adapter_pushes_out_as_many_small_ones_as_it_needs():
    reg = Registry(make_adapter(2, seed=1), make_adapter(2, seed=2), make_adapter(2, seed=3),
                   make_adapter(16, ALL, seed=4))  # fmt: skip
    v0, v1, v2, big = reg.versions
    small, large = float32_bytes(2), float32_bytes(16, ALL)
    host = cache(reg, None, max_bytes=large + small)
    fetch_all(host, v0, v1, v2)
    assert host.used_bytes == 3 * small
    assert fetch_all(host, big) == ["registry"]
    assert host.versions() == [v2, big] and host.used_bytes == large + small
    assert host.evictions == 2


def test_both_bounds_hold_and_the_tighter_one_binds():
    reg = Registry(*(make_adapter(4, seed=i) for i in range(4)))
    size = float32_bytes(4)
    by_count = cache(reg, 2, max_bytes=100 * size)
    fetch_all(by_count, *reg.versions)
    assert by_count.versions() == reg.versions[2:] and by_count.used_bytes == 2 * size
    by_bytes = cache(reg, 3, max_bytes=size)
    fetch_all(by_bytes, *reg.versions)
    assert by_bytes.versions() == reg.versions[3:] and by_bytes.evictions == 3
    unbounded = cache(reg, None, None)
    fetch_all(unbounded, *reg.versions)
    assert len(unbounded) == 4 and unbounded.used_bytes == 4 * size
    assert (unbounded.capacity, unbounded.max_bytes) == (None, None)


def test_an_adapter_larger_than_the_budget_is_served_but_not_cached():
    reg = Registry(make_adapter(4, seed=1), make_adapter(16, ALL, seed=2))
    small, big = reg.versions
    host = cache(reg, None, max_bytes=float32_bytes(8))
    fetch_all(host, small)
    adapter, tier = host.fetch(big)
    assert adapter is reg.adapters[big] and tier == "registry"
    assert fetch_all(host, big, small) == ["registry", "host"]  # it took nobody's room
    assert host.versions() == [small] and host.evictions == 0
    assert reg.calls[big] == 2


def test_no_room_caches_nothing_and_bad_bounds_are_refused():
    reg = Registry(make_adapter(4))
    for host in (cache(reg, 0, None), cache(reg, None, 0)):
        assert fetch_all(host, *reg.versions, *reg.versions) == ["registry"] * 2
        assert (len(host), host.used_bytes) == (0, 0)
    with pytest.raises(ValueError, match="max_cpu_loras must be >= 0"):
        cache(reg, -1, None)
    with pytest.raises(ValueError, match="byte budget must be >= 0"):
        cache(reg, None, -1)


def test_the_positional_form_still_builds_a_count_bounded_tier():
    reg = Registry(make_adapter(4, seed=1), make_adapter(4, seed=2))
    host = HostCache(1, reg, lambda v, a: None, lock=threading.Lock(), pin=False)
    fetch_all(host, *reg.versions)
    assert host.versions() == reg.versions[1:] and host.max_bytes is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_pinned_copies_replace_the_file_bytes_they_were_views_of():
    reg = Registry(make_adapter(8))
    host = HostCache(None, reg, lambda v, a: None, lock=threading.Lock(), pin=True,
                     max_bytes=1 << 20)  # fmt: skip
    adapter, _ = host.fetch(reg.versions[0])
    assert all(m.a.is_pinned() and m.b.is_pinned() for m in adapter.modules.values())
    assert adapter.weights_bytes == b"" and host.used_bytes == float32_bytes(8)
