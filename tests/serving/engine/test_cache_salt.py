"""The prefix cache shares hits only between requests with the same salt (the tenant), so
cached_tokens tells no tenant whether another sent a prompt; unsalted requests share as before."""

import pytest

from serving.engine.block_hash import prefix_key
from serving.engine.request import GenerateRequest
from tests.serving.engine.test_engine_peft import Collector, greedy
from tests.serving.engine.world import build_world

PROMPT = tuple(range(40, 72))  # 32 tokens: 8 full blocks of 4


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("salt"))


def cached(engine, rid, salt, adapter=None):
    c = Collector()
    engine.submit(GenerateRequest(rid, PROMPT, greedy(3), adapter, cache_salt=salt), c.sink)
    engine.run_until_idle()
    return c.done[rid].cached_tokens, c.tokens[rid]


@pytest.mark.parametrize("adapter", [None, "upper"])
def test_a_guess_of_another_tenants_prompt_hits_nothing(world, adapter):
    engine = world.engine()
    version = world.versions[adapter] if adapter else None
    assert cached(engine, "a1", "tenant-a", version)[0] == 0
    a2, tokens_a = cached(engine, "a2", "tenant-a", version)
    assert a2 >= 28  # A's own repeat hits its full blocks
    b, tokens_b = cached(engine, "b", "tenant-b", version)
    assert b == 0  # B's guess of A's prompt learns nothing
    assert tokens_b == tokens_a  # and computes the same tokens
    assert cached(engine, "open", None, version)[0] == 0  # nor does an unsalted request


def test_unsalted_requests_share_hits_as_before(world):
    engine = world.engine()
    assert cached(engine, "x1", None)[0] == 0
    assert cached(engine, "x2", None)[0] >= 28


def test_no_salt_and_digest_pair_reads_as_another():
    def key(adapter, salt):
        return prefix_key(GenerateRequest("r", (1,), adapter=adapter, cache_salt=salt))

    assert key(None, None) is None and key("a@d1", None) == "d1"
    keys = [key(None, "t"), key("a@d1", "t"), key("a@d1", "t:"), key(None, "t:d1"), key(None, "")]
    assert len(set(keys)) == len(keys) and None not in keys and "d1" not in keys
