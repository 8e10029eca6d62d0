"""Which adapters the draft runs base-only: one whose companion failed to load for a passing
reason gets its companion once COMPANION_RETRY_S has passed; the versions remembered stay
within MAX_BASE_ONLY however many adapters come."""

import pytest

from adapters.errors import AdapterError
from serving.engine.request import GenerateRequest
from serving.engine.speculative import draft
from tests.serving.engine.speculative import spec_world
from tests.serving.engine.speculative.spec_world import spec_engine
from tests.serving.engine.test_engine_peft import Collector, greedy
from tests.serving.engine.world import build_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("companions-world"))


def acceptance(engine, version: str, tag: str) -> float:
    """Accepted over proposed drafts of three requests of version (the world's "mlp"), run
    to the end now."""
    stats = engine.spec.stats.by_adapter.get("mlp")
    before = (stats.accepted, stats.proposed) if stats else (0, 0)
    for i in range(3):
        request = GenerateRequest(f"{tag}{i}", (5, 6, 7, 8, 9, i), greedy(16), version)
        engine.submit(request, Collector().sink)
    engine.run_until_idle()
    stats = engine.spec.stats.by_adapter["mlp"]
    return (stats.accepted - before[0]) / (stats.proposed - before[1])


def test_a_companion_whose_load_failed_is_tried_again_after_a_while(world, monkeypatch):
    """Draft = base, so with its companion the draft is perfect for the adapter (acceptance
    1.0), and without it is not. The companion's first load fails as an unreachable registry
    does: the adapter drafts base-only until COMPANION_RETRY_S have passed, then under its
    companion."""
    load, calls = spec_world.load_adapter, []

    def flaky(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 1:
            raise AdapterError("the adapter registry cannot be reached; try again")
        return load(*args, **kwargs)

    monkeypatch.setattr(spec_world, "load_adapter", flaky)
    engine = spec_engine(world, "draft_model", draft="same", companions=("mlp",))
    now = [0.0]
    engine.spec.draft.base_only.clock = lambda: now[0]
    version = world.versions["mlp"]
    assert acceptance(engine, version, "failed") < 1.0
    now[0] = draft.COMPANION_RETRY_S / 2
    assert acceptance(engine, version, "waiting") < 1.0
    assert len(calls) == 1  # not tried again yet
    now[0] = draft.COMPANION_RETRY_S + 1
    assert acceptance(engine, version, "retried") == 1.0
    assert len(calls) == 2


def test_the_versions_drafting_base_only_are_bounded(world, monkeypatch):
    """Adapters without a companion are remembered (their load is not tried at every step),
    the most recent MAX_BASE_ONLY of them."""
    monkeypatch.setattr(draft, "MAX_BASE_ONLY", 2)
    engine = spec_engine(world, "draft_model", draft="same", companions=("mlp",))
    names = ("upper", "rot13", "qk", "ov")
    for i, name in enumerate(names):
        request = GenerateRequest(f"n{i}", (5, 6, 7, i), greedy(6), world.versions[name])
        engine.submit(request, Collector().sink)
        engine.run_until_idle()
    base_only = engine.spec.draft.base_only
    assert len(base_only) == 2
    assert [world.versions[n] in base_only for n in names] == [False, False, True, True]
