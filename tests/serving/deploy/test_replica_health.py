"""A replica whose engine step thread has died says so: not ready (so /readyz answers 503),
unhealthy (so Ray Serve replaces it), and a new request fails at once instead of waiting."""

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from serving.api.core import generator as generator_module
from serving.config import parse_config
from serving.deploy import replica
from serving.engine.request import GenerateRequest, SamplingParams

DEMO = Path(__file__).resolve().parents[3] / "models" / "demo" / "base"


@pytest.fixture
def server(monkeypatch, tmp_path):
    """A ModelServer built as Ray Serve would, outside Ray: only the replica id is faked."""
    context = SimpleNamespace(replica_id=SimpleNamespace(unique_id="r1"))
    monkeypatch.setattr(replica.serve, "get_replica_context", lambda: context)
    cfg = parse_config({"model": {"path": str(DEMO), "max_model_len": 64},
                        "cache": {"num_blocks": 16}, "lora": {"registry": str(tmp_path)}})  # fmt: skip
    server = replica.EngineReplica(cfg)
    yield server
    server.close()


def _end_step_thread(engine) -> None:
    # Stopped behind the generator's back: from the replica, a thread that died looks the same.
    engine.shutdown()
    assert not engine.alive


def test_a_dead_step_thread_makes_the_replica_unready_and_unhealthy(server):
    assert asyncio.run(server.ready()) is True
    server.check_health()
    _end_step_thread(server.engine)
    assert asyncio.run(server.ready()) is False
    with pytest.raises(RuntimeError, match="step thread"):
        server.check_health()


def test_a_request_to_a_dead_engine_fails_at_once(server):
    _end_step_thread(server.engine)
    request = GenerateRequest("r", (1, 2, 3), SamplingParams(max_tokens=2), None)

    async def first():
        return await anext(server.generate(request))

    with pytest.raises(RuntimeError, match="stopped"):
        asyncio.run(asyncio.wait_for(first(), timeout=10))


def test_a_stopped_listener_makes_the_replica_unhealthy(server):
    """Its port would be refused until Ray Serve replaced it: the health check says so."""
    from starlette.applications import Starlette

    from serving.deploy.listener import ReplicaListener
    from tests.serving.deploy.served import free_port

    async def stopped_listener() -> ReplicaListener:
        listener = ReplicaListener(Starlette(), "127.0.0.1", free_port(), drain_s=1)
        server.listener = listener
        server.check_health()  # serving: healthy
        await listener.drain()
        return listener

    asyncio.run(stopped_listener())
    with pytest.raises(RuntimeError, match="HTTP listener"):
        server.check_health()


def test_every_stream_the_replica_serves_is_paced(server, monkeypatch):
    """Its own listener's streams and those forwarded from a peer alike: each increment costs
    the replica's loop (and a forwarded one a Ray message), so all are paced by how many are
    open (server.stream_interval_ms)."""
    pauses = []
    monkeypatch.setattr(generator_module, "stream_pause", lambda *a: pauses.append(a) or 0.0)
    request = GenerateRequest("r", (1, 2, 3), SamplingParams(max_tokens=4, ignore_eos=True))

    async def outputs() -> int:
        return len([out async for out in server.serve_here(request, None)])

    assert asyncio.run(outputs()) >= 2
    assert pauses and all(p == (1, server.cfg.server.stream_interval_ms / 1000) for p in pauses)


def test_a_routing_id_leaves_the_in_flight_table_with_its_last_stream(server, monkeypatch):
    """The table AdapterRouter reads holds the ids of open streams only: one adapter version
    after another served here leaves no entry behind."""
    loaded = []

    async def load(model_id: str) -> str:  # Ray's multiplex LRU needs a running replica
        loaded.append(model_id)
        return model_id

    monkeypatch.setattr(server, "_load", load)
    params = SamplingParams(max_tokens=2, ignore_eos=True)

    async def serve_ids(ids) -> dict:
        open_stream = server.serve_here(GenerateRequest("open", (1, 2, 3), params), "held@1")
        await anext(open_stream)  # held@1's stream stays open while the others run
        for i, model_id in enumerate(ids):
            request = GenerateRequest(f"r{i}", (1, 2, 3), params)
            assert [out async for out in server.serve_here(request, model_id)]
        during = dict(server.in_flight)
        await open_stream.aclose()
        return during

    during = asyncio.run(serve_ids([f"a{i}@{i}" for i in range(20)] + [None]))
    assert len(loaded) == 21
    assert during == {"held@1": 1}
    assert server.in_flight == {}
    assert server.record_routing_stats() == {"in_flight": {}, "running": 0}
    state = asyncio.run(server.figures()).state  # what /metrics shows of this replica
    assert state["routing_in_flight"] == (0, None)
    assert state["routing_ids"] == (21, server.held.capacity)
    assert state["prefix_cache_blocks"][1] == 16  # beside the engine's own
