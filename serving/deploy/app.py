"""The Ray Serve application: `build({"config": PATH})`, also the Helm chart's import_path.

    serve run serving.deploy.app:build config=configs/demo.yaml

build() reads the API keys and refuses a keyless server beyond loopback (see exposure),
publishes the config's preloaded adapters, then binds one Ingress (no CPU of its own: it
only parses HTTP and relays streams) to `deploy.num_replicas` ModelServers. The keys travel
to the Ingress as an argument, so replicas on other nodes need neither the env nor the file.
A preloaded adapter folder may hold its draft-model companion in a `draft/` subfolder (as
the demo kit's adapters do); it is published with the adapter.
"""

from __future__ import annotations

from collections.abc import Mapping

from ray.serve import Application

from adapters.format import load_adapter
from adapters.registry import Registry, Version
from serving.api.auth import Principal
from serving.api.settings import served_spec
from serving.config import ServeConfig, load_config
from serving.deploy.engine_setup import check_draft_vocab
from serving.deploy.exposure import load_checked_keys
from serving.deploy.ingress import Ingress
from serving.deploy.replica import ModelServer

APP_NAME = "loraserve"
PRELOAD_OWNER = "default"  # the tenant an open (keyless) server uses; see serving.api.auth


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
    """Ingress + ModelServer bound with the deployment options the config asks for.

    keys: every API key (empty: open, loopback only), as read by whoever builds the app.
    """
    per_replica = cfg.scheduler.max_num_seqs
    server = ModelServer.options(
        num_replicas=cfg.deploy.num_replicas,
        ray_actor_options={
            "num_cpus": cfg.deploy.resources.num_cpus,
            "num_gpus": cfg.deploy.resources.num_gpus,
        },
        # Ray's default of 5 in flight per replica would starve continuous batching:
        # a replica takes as many calls as its engine runs sequences at once.
        max_ongoing_requests=per_replica,
        # Beyond this many waiting calls the caller gets QueueFull (HTTP 429) at once.
        max_queued_requests=cfg.server.max_queue,
    )
    ingress = Ingress.options(
        # Every stream being generated or queued holds one ingress call open.
        max_ongoing_requests=per_replica * cfg.deploy.num_replicas + cfg.server.max_queue,
    )
    return ingress.bind(server.bind(cfg), cfg, dict(keys))


def publish_preloads(cfg: ServeConfig) -> list[Version]:
    """Validate each lora.preload adapter against the model and publish it (no-op if same)."""
    if not cfg.lora.preload:
        return []
    registry = Registry(cfg.lora.registry)
    spec = served_spec(cfg.model.path, cfg.model.dtype)
    versions = []
    for name, path in cfg.lora.preload.items():
        companion = path / "draft"
        draft = companion if (companion / "adapter_config.json").is_file() else None
        adapter = load_adapter(
            path, draft=draft, base=spec, base_name=cfg.model.id, max_rank=cfg.lora.max_lora_rank
        )
        versions.append(registry.publish(name, adapter, owner=PRELOAD_OWNER))
    return versions
