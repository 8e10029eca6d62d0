"""The Ray Serve application: `build({"config": PATH})`, also the Helm chart's import_path.

    serve run serving.deploy.app:build config=configs/demo.yaml

build() reads the API keys and refuses a keyless server beyond loopback (see exposure),
publishes the config's preloaded adapters, then binds three deployments: `deploy.num_replicas`
ModelServers, each serving the HTTP app in front of its own engine (see replica); one
Tenancy (`num_cpus: 0`) that holds tenants' rate limits and writes the usage store for all of
them (see tenancy); and one Batch (`num_cpus: 0`) that holds the batch store and feeds its
items to the ModelServers (see batch). The keys travel to the replicas as an argument, so replicas on other
nodes need neither the env nor the file.
Preloads belong to the reserved tenant `operator` and are public: every tenant may use
them, and only an admin key may change or delete them.
A preloaded adapter folder may hold its draft-model companion in a `draft/` subfolder (as
the demo kit's adapters do); it is published with the adapter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from adapters.format.adapter import load_adapter
from adapters.registry.names import OPERATOR
from adapters.registry.records import Version
from adapters.registry.registry import Registry
from serving.api.core.caller import Principal
from serving.api.core.settings import served_spec
from serving.config import ServeConfig, load_config
from serving.deploy.batch_service import BatchServer
from serving.deploy.exposure import load_checked_keys
from serving.deploy.replica import SERVER_NAME, ModelServer
from serving.deploy.router import ROUTING_STATS_PERIOD_S, AdapterRouter
from serving.deploy.routing import spread_at
from serving.deploy.tenancy import TenancyServer
from serving.engine.from_config import check_draft_vocab
from serving.model.checkpoint import model_folder

APP_NAME = "loraserve"
# Ray Serve runs a replica's user code on a second event loop by default, so every HTTP
# message of the app crosses threads; on the replica's own loop the streams cost less
# (bench/README.md, "The server under load"). The engine's step loop has its own thread.
REPLICA_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}


def build(args: dict) -> Application:
    """The application for the config at args["config"] (a YAML path; cwd-relative paths)."""
    if "config" not in args:
        raise ValueError('serving.deploy.app:build needs the argument {"config": PATH}')
    cfg = load_config(args["config"])
    keys = load_checked_keys(cfg)
    check_draft_vocab(cfg)
    publish_preloads(cfg)
    return bind(cfg, keys)


def bind(cfg: ServeConfig, keys: Mapping[str, Principal]) -> Application:
    """The ModelServer deployment with the options the config asks for.

    keys: every API key (empty: open, loopback only), as read by whoever builds the app.
    """
    server = ModelServer.options(
        num_replicas=cfg.deploy.num_replicas,
        ray_actor_options={
            "num_cpus": cfg.deploy.resources.num_cpus,
            "num_gpus": cfg.deploy.resources.num_gpus,
            "runtime_env": {"env_vars": REPLICA_ENV},
        },
        # A replica's calls through Ray are the requests other replicas forward to it and the
        # batch items fed to it (its own listener's requests are not counted). Ray's default
        # of 5 would starve continuous batching; the engine's queue (server.max_queue)
        # answers 429 beyond what it can hold.
        max_ongoing_requests=cfg.scheduler.max_num_seqs * cfg.deploy.num_replicas
        + cfg.server.max_queue,
        # Beyond this many waiting calls the caller gets QueueFull (HTTP 429) at once.
        max_queued_requests=cfg.server.max_queue,
        request_router_config=RequestRouterConfig(
            request_router_class=AdapterRouter,
            request_router_kwargs={
                "spread_at": spread_at(cfg),
                "full_at": cfg.scheduler.max_num_seqs,
            },
            request_routing_stats_period_s=ROUTING_STATS_PERIOD_S,
        ),
    )
    tenancy = TenancyServer.bind(cfg.usage.store, cfg.limits)
    batch = BatchServer.bind(
        cfg.batch.store,
        max_in_flight=cfg.batch.max_in_flight * cfg.deploy.num_replicas,
        ttl_s=cfg.batch.ttl_hours * 3600,
        server_name=SERVER_NAME,
        app_name=APP_NAME,
        tenancy=tenancy,
        min_free_bytes=cfg.batch.min_free_mb * 2**20,
    )
    return server.bind(cfg, dict(keys), tenancy, batch)


def publish_preloads(cfg: ServeConfig) -> list[Version]:
    """Validate each lora.preload adapter against the model and publish it (no-op if same)."""
    if not cfg.lora.preload:
        return []
    registry = Registry(cfg.lora.registry)
    spec = served_spec(model_folder(cfg.model.path), cfg.model.dtype, cfg.lora.embeddings)
    versions = []
    for name, path in cfg.lora.preload.items():
        companion = path / "draft"
        draft = companion if (companion / "adapter_config.json").is_file() else None
        adapter = load_adapter(
            path, draft=draft, base=spec, base_name=cfg.model.id, max_rank=cfg.lora.max_lora_rank
        )
        version = registry.publish(name, adapter, owner=OPERATOR)
        if not version.public:
            registry.set_public(name, OPERATOR, True)
        versions.append(dataclasses.replace(version, public=True))
    return versions
