"""Which multiplexed id a request carries, so Ray routes it to a replica with its state."""

from collections import OrderedDict

from serving.config import parse_config
from serving.deploy.routing import models_per_replica, num_session_ids, routing_id

IDS = 16  # session ids in the tests below


def test_adapter_version_wins_then_session_then_none():
    assert routing_id("upper@abc", "s1", IDS) == "upper@abc"  # the adapter's hot replica
    assert routing_id("upper@abc", None, IDS) == "upper@abc"
    session = routing_id(None, "s1", IDS)  # a base-only conversation
    assert session.startswith("session:") and session == routing_id(None, "s1", IDS)
    assert routing_id(None, None, IDS) is None  # balanced over every replica


def test_a_reupload_routes_as_a_new_model():
    assert routing_id("upper@abc", None, IDS) != routing_id("upper@def", None, IDS)


def test_sessions_share_a_fixed_set_of_ids_spread_over_it():
    ids = {routing_id(None, f"conversation-{i}", IDS) for i in range(2000)}
    assert len(ids) == IDS  # bounded however many sessions a client invents, and all used
    assert routing_id(None, "\ud800", IDS)  # a lone surrogate in the header still hashes


def test_a_flood_of_sessions_never_evicts_adapter_affinity():
    """Ray's per-replica LRU of multiplexed ids, fed as a replica would be: as many hot
    adapters as its slab has pages, then thousands of new sessions, each adapter still used
    now and then."""
    cfg = parse_config({"deploy": {"num_replicas": 2}})
    capacity, lru = models_per_replica(cfg, slab_pages=4), OrderedDict()

    def load(model_id):  # what serve.multiplexed does with a call's id
        lru[model_id] = None
        lru.move_to_end(model_id)
        while len(lru) > capacity:
            lru.popitem(last=False)

    adapters = [f"a{i}@digest" for i in range(4)]
    for a in adapters:
        load(a)
    for i in range(5000):
        load(routing_id(None, f"session-{i}", num_session_ids(cfg)))
        if i % 100 == 0:
            load(routing_id(adapters[(i // 100) % len(adapters)], None, num_session_ids(cfg)))
    assert all(a in lru for a in adapters)


def test_a_replica_keeps_as_many_adapter_ids_as_its_slab_has_pages():
    from serving.deploy.routing import MAX_ADAPTER_IDS

    cfg = parse_config({"deploy": {"num_replicas": 3}})
    sessions = num_session_ids(cfg)
    assert sessions == 24
    assert models_per_replica(cfg, slab_pages=300) == 300 + sessions  # one small adapter a page
    assert models_per_replica(cfg, slab_pages=10**6) == MAX_ADAPTER_IDS + sessions
    counted = parse_config({"lora": {"max_loras": 4}})  # 4 adapters of rank 64: 32 pages
    assert models_per_replica(counted, slab_pages=32) == 32 + num_session_ids(counted)


def test_deployment_options_follow_the_config():
    """One deployment: replicas reserve what deploy.resources asks, take every stream of the
    app (Ray's 5 would starve batching), and route through AdapterRouter."""
    from serving.deploy.app import bind
    from serving.deploy.router import AdapterRouter

    cfg = parse_config({"scheduler": {"max_num_seqs": 8}, "server": {"max_queue": 9},
                        "deploy": {"num_replicas": 2, "resources": {"num_cpus": 1.5}}})  # fmt: skip
    server = bind(cfg, {})._bound_deployment
    config = server._deployment_config
    assert config.max_ongoing_requests == 8 * 2 + 9
    assert config.max_queued_requests == 9
    assert config.num_replicas == 2
    options = server.ray_actor_options
    assert (options["num_cpus"], options["num_gpus"]) == (1.5, 0.0)
    assert options["runtime_env"]["env_vars"]["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
    assert config.request_router_config.get_request_router_class() is AdapterRouter
    assert config.request_router_config.request_router_kwargs == {"spread_at": 2, "full_at": 8}


def test_a_hot_adapter_is_copied_to_the_least_busy_replica_and_a_cold_one_stays():
    from types import SimpleNamespace

    from serving.deploy.router import copy_target

    def replica(ids, in_flight, running):
        stats = {"in_flight": in_flight, "running": running}
        return SimpleNamespace(multiplexed_model_ids=set(ids), routing_stats=stats)

    def target(replicas, model_id):
        return copy_target(replicas, model_id, spread_at=4, full_at=16)

    holder = replica({"hot", "cold"}, {"hot": 4, "cold": 1}, 5)
    idle, busy = replica(set(), {}, 0), replica({"other"}, {"other": 2}, 2)
    assert target([holder, busy, idle], "hot") is idle
    assert target([holder, busy, idle], "cold") is None  # stays
    assert target([holder, busy, idle], "new") is None  # Ray places it
    copy = replica({"hot"}, {"hot": 3}, 3)  # copied once, and that copy is not busy yet
    assert target([holder, copy, idle], "hot") is None
    assert target([holder], "hot") is None  # nowhere else to go
    no_stats = SimpleNamespace(multiplexed_model_ids={"hot"}, routing_stats=None)
    assert target([no_stats, idle], "hot") is None
    # A full batch of other adapters' requests: a cold one goes where there is room, and
    # waits for its holder when there is none elsewhere.
    full = replica({"cold", "hot"}, {"hot": 3, "cold": 1}, 16)
    assert target([full, busy, idle], "cold") is idle
    assert target([full, replica(set(), {}, 16)], "cold") is None
    assert target([full, replica(set(), {}, 15)], "cold") is not None


def test_a_request_waits_for_its_adapters_holders_even_after_a_refusal():
    import asyncio
    from types import SimpleNamespace

    from ray.serve._private.request_router.common import RequestRoutingContext

    from serving.deploy.router import AdapterRouter

    def replica(ids, in_flight):
        stats = {"in_flight": in_flight, "running": sum(in_flight.values())}
        return SimpleNamespace(multiplexed_model_ids=set(ids), routing_stats=stats)

    def request(model_id):
        # As Ray leaves it after the holders refused once (or a probe timed out): its own
        # rule would now try the replicas holding the fewest ids.
        context = RequestRoutingContext(tried_first_multiplexed_models=True)
        metadata = SimpleNamespace(multiplexed_model_id=model_id)
        return SimpleNamespace(metadata=metadata, routing_context=context)

    router = AdapterRouter.__new__(AdapterRouter)  # choose_replicas needs only its state
    router.initialize_state(spread_at=4, full_at=16)
    holder = replica({"hot", "cold"}, {"hot": 4, "cold": 1})
    other, empty = replica({"x"}, {"x": 1}), replica(set(), {})
    replicas = [holder, other, empty]

    def choose(model_id):
        pending = request(model_id)
        ranks = asyncio.run(router.choose_replicas(replicas, pending))
        assert pending.routing_context.should_backoff  # retried after a pause, not spun
        return ranks

    for _ in range(20):
        assert choose("cold") == [[holder]]  # never the emptier replicas
        assert choose("hot") == [[empty]]  # a copy is due: the least busy replica
    two = replica({"cold"}, {"cold": 1})
    replicas.append(two)
    assert {id(r) for r in choose("cold")[0]} == {id(holder), id(two)}  # the less busy


def test_arrivals_count_by_adapter_name_with_bounded_labels():
    from serving.deploy.arrivals import Arrivals

    arrivals = Arrivals(max_labels=2)
    arrivals.record(None, True)
    arrivals.record("a@d1", False)
    arrivals.record("a@d2", True)  # a re-upload counts under its name
    arrivals.record("b@d3", True)  # past the bound: "other"
    assert arrivals.snapshot() == {
        "base": {"resident": 1, "missing": 0},
        "a": {"resident": 1, "missing": 1},
        "other": {"resident": 1, "missing": 0},
    }


def test_the_batch_deployment_takes_no_cpu_on_the_head_and_feeds_every_replica():
    """One Batch replica with num_cpus 0 on the head node (where batch.store is one file),
    keeping batch.max_in_flight items running per ModelServer replica."""
    from serving.deploy.app import bind
    from serving.deploy.head_node import HEAD_NODE

    cfg = parse_config({"batch": {"max_in_flight": 3, "ttl_hours": 2},
                        "deploy": {"num_replicas": 2}})  # fmt: skip
    *_, batch = bind(cfg, {})._bound_deployment.init_args
    deployment = batch._bound_deployment
    assert deployment._deployment_config.num_replicas == 1
    assert deployment.ray_actor_options["num_cpus"] == 0
    assert HEAD_NODE in deployment.ray_actor_options["resources"]
    assert deployment.init_kwargs["max_in_flight"] == 3 * 2
    assert deployment.init_kwargs["ttl_s"] == 2 * 3600
