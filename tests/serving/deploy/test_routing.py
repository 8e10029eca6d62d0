"""Which multiplexed id a request carries, so Ray routes it to a replica with its state."""

from serving.deploy.replica import routing_id


def test_adapter_version_wins_then_session_then_none():
    assert routing_id("upper@abc", "s1") == "upper@abc"  # the adapter's hot replica
    assert routing_id("upper@abc", None) == "upper@abc"
    assert routing_id(None, "s1") == "session:s1"  # a base-only conversation
    assert routing_id(None, None) is None  # balanced over every replica


def test_a_reupload_routes_as_a_new_model():
    assert routing_id("upper@abc", None) != routing_id("upper@def", None)


def test_streams_are_paced_by_how_many_are_open():
    from serving.deploy.replica import MESSAGES_PER_SECOND, stream_pause

    assert stream_pause(1, 0.1) == 1 / MESSAGES_PER_SECOND
    assert stream_pause(32, 0.1) == 32 / MESSAGES_PER_SECOND
    assert stream_pause(640, 0.1) == 0.1  # never longer than the configured interval
    assert stream_pause(8, 0.0) == 0.0


def test_deployment_options_follow_the_config():
    """max_ongoing_requests follows max_num_seqs (Ray's 5 would starve batching), the ingress
    reserves no CPU, and replicas reserve what deploy.resources asks."""
    from serving.config import parse_config
    from serving.deploy.app import bind

    cfg = parse_config({"scheduler": {"max_num_seqs": 7}, "server": {"max_queue": 9},
                        "deploy": {"num_replicas": 2, "resources": {"num_cpus": 1.5}}})  # fmt: skip
    ingress = bind(cfg)._bound_deployment
    server = ingress.init_args[0]._bound_deployment
    assert ingress.ray_actor_options["num_cpus"] == 0
    assert ingress._deployment_config.max_ongoing_requests == 7 * 2 + 9
    assert server._deployment_config.max_ongoing_requests == 7
    assert server._deployment_config.max_queued_requests == 9
    assert server._deployment_config.num_replicas == 2
    assert server.ray_actor_options == {"num_cpus": 1.5, "num_gpus": 0.0}
