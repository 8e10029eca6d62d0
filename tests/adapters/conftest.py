"""Fixtures of the adapter tests."""

from contextlib import ExitStack, closing

import pytest

from adapters.slab import AdapterSlab
from tests.adapters.factory import TINY_SPEC


@pytest.fixture
def make_slab():
    """Build slabs over TINY_SPEC with small defaults; each is closed after the test."""
    defaults = {"num_slots": 3, "max_rank": 16, "max_cpu_loras": 4}
    with ExitStack() as stack:
        yield lambda reg, **kw: stack.enter_context(
            closing(AdapterSlab(TINY_SPEC, loader=reg, **{**defaults, **kw}))
        )
