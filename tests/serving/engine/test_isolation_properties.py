"""A property of the engine: whatever sampling fields one request carries, within the ranges
the API accepts, a greedy request with an adapter beside it gets exactly its tokens alone."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.engine.request import GenerateRequest, SamplingParams
from tests.serving.engine.test_engine_peft import Collector, greedy
from tests.serving.engine.world import build_world

PROMPT = (5, 6, 7, 8, 9)


def edge_floats(low: float, high: float, *, low_open: bool = False) -> st.SearchStrategy:
    """Floats in the range, weighted to its edges: 0, subnormals, the bounds, just inside them."""
    edges = [x for x in (low, high, 5e-324, 1e-310, 1e-40, 1e-6, 1e-5, 9.99e-6, 0.0, -5e-324)
             if low <= x <= high and not (low_open and x == low)]  # fmt: skip
    return st.one_of(
        st.sampled_from(edges),
        st.floats(low, high, exclude_min=low_open, allow_subnormal=True),
    )


FIELDS = st.fixed_dictionaries(
    {
        "temperature": edge_floats(0.0, 2.0),
        "top_p": edge_floats(0.0, 1.0, low_open=True),
        "top_k": st.one_of(st.sampled_from([0, 1, 511, 512, 10**30]), st.integers(0, 600)),
        "repetition_penalty": edge_floats(0.0, 2.0, low_open=True),
        "frequency_penalty": edge_floats(-2.0, 2.0),
        "presence_penalty": edge_floats(-2.0, 2.0),
        "seed": st.one_of(st.none(), st.sampled_from([0, 2**63 - 1]), st.integers(0, 2**63 - 1)),
        "logprobs": st.one_of(st.none(), st.integers(0, 20)),
        "max_tokens": st.integers(1, 6),
    }
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("isolation-props"))


@pytest.fixture(scope="module")
def alone(world):
    engine, c = world.engine(), Collector()
    engine.submit(GenerateRequest("innocent", PROMPT, greedy(8), world.versions["rot13"]), c.sink)
    engine.run_until_idle()
    return c.tokens["innocent"]


@pytest.fixture(scope="module")
def engine(world):
    """One engine for every example: what one example leaves in its prefix cache is exact."""
    return world.engine()


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(fields=FIELDS)
def test_drawn_sampling_fields_never_change_an_innocent_neighbour(world, engine, alone, fields):
    c = Collector()
    engine.submit(GenerateRequest("innocent", PROMPT, greedy(8), world.versions["rot13"]), c.sink)
    drawn = SamplingParams(ignore_eos=True, **fields)
    engine.submit(GenerateRequest("drawn", (3, 4, 5, 3, 4), drawn, world.versions["mlp"]), c.sink)
    engine.run_until_idle()
    assert c.tokens["innocent"] == alone
    assert c.done["drawn"].finish_reason == "length", c.done["drawn"].error
    assert all(0 <= t < 512 for t in c.tokens["drawn"])
