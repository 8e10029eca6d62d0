"""Fixtures the engine tests share."""

import pytest


@pytest.fixture
def engines(world):
    """world.engine(**config) (world: the module's own fixture), each shut down after the
    test, so its grammar compile processes end with it."""
    made = []
    yield lambda **config: made.append(world.engine(**config)) or made[-1]
    for engine in made:
        engine.shutdown()
