"""loraserve's HTTP app and engine in one process, without Ray, for bench/serve.py.

    python -m bench.peers.local_server --config CONFIG --port PORT

The same config, app (serving.api.create_app) and engine (serving.engine.from_config) as
`loraserve serve`, but the routes call the engine in this process (LocalGenerator) instead
of going through Ray Serve's HTTP proxy and replica handles: the difference between the two
rows in bench/serve.py's table is what those hops cost. Batches are stored in batch.store and
fed in this process (bench/batch_api.py); usage goes to usage.store under the config's limits. Stops on SIGINT/SIGTERM (uvicorn's own handlers), then
stops the engine.
"""

from __future__ import annotations

import argparse

import uvicorn

from serving.api import LocalGenerator, create_app, settings_from_config
from serving.api.batch.local_store import LocalBatch
from serving.api.core.tenancy import LocalTenancy
from serving.batch.store import BatchStore
from serving.config import load_config
from serving.deploy.app import publish_preloads
from serving.engine.from_config import build_engine
from serving.usage.service import Tenancy, limits_from_config
from serving.usage.store import UsageStore


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    settings = settings_from_config(cfg)
    publish_preloads(cfg)  # the engine's slab loads adapters from the registry, as a replica's
    generator = LocalGenerator(build_engine(cfg), cfg.server.max_queue,
                               stream_interval=cfg.server.stream_interval_ms / 1000)  # fmt: skip
    settings.ready.set()
    store = BatchStore(cfg.batch.store, min_free_bytes=cfg.batch.min_free_mb * 2**20)
    batch = LocalBatch(store, max_in_flight=cfg.batch.max_in_flight,
                       ttl_s=cfg.batch.ttl_hours * 3600)  # fmt: skip
    tenancy = LocalTenancy(Tenancy(UsageStore(cfg.usage.store), limits_from_config(cfg.limits)))
    app = create_app(generator, settings, tenancy, batch)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        generator.close()


if __name__ == "__main__":
    main()
