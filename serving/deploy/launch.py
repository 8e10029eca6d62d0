"""`loraserve serve`: start (or join) Ray, run the app, block until Ctrl-C or SIGTERM.

One command serves on one machine: with no `deploy.ray_address` a private local Ray starts
(no dashboard) and stops with the server. With an address, the app joins that cluster and
only its own application is removed at exit; the cluster keeps running.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import ray
from ray import serve

from serving.api.settings import settings_from_config
from serving.config import ServeConfig
from serving.deploy.app import APP_NAME, bind, publish_preloads
from serving.deploy.engine_setup import check_draft_vocab
from serving.deploy.exposure import load_checked_keys

# Ray puts unix sockets under its temp dir, and a socket path must stay under 107 bytes:
# beyond this many characters the session's socket paths would not fit.
MAX_TEMP_DIR_CHARS = 40
# Ray and Serve log every start-up step and request at INFO; the console gets warnings and
# errors only (Ray's session folder keeps the full logs).
LOG_LEVEL = logging.WARNING
QUIET = {"log_level": "WARNING"}


def ray_temp_dir() -> str:
    """The user's cache (~/.cache/loraserve/ray) when short enough for Ray's sockets, else /tmp."""
    try:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        preferred = cache / "loraserve" / "ray"
        if len(str(preferred)) <= MAX_TEMP_DIR_CHARS:
            preferred.mkdir(parents=True, exist_ok=True)
            return str(preferred)
    except (OSError, RuntimeError):  # no home, or a read-only one
        pass
    return str(Path(tempfile.gettempdir()) / f"loraserve-ray-{os.getuid()}")


def serve_until_stopped(cfg: ServeConfig, echo: Callable[[str], None] = print) -> None:
    """Publish preloads, run the app on server.host:port, block until a signal, then drain."""
    host, port = cfg.server.host, cfg.server.port
    # Before Ray starts, so a keyless public host, a bad model folder or adapter fails in a
    # second with its own message, rather than as a replica that failed to deploy.
    keys = load_checked_keys(cfg)
    settings_from_config(cfg)
    check_draft_vocab(cfg)
    publish_preloads(cfg)
    local = cfg.deploy.ray_address is None
    if local:  # on a cluster the HTTP proxies listen on its nodes, not necessarily here
        _check_free(host, port)
    logging.getLogger("ray.serve").setLevel(LOG_LEVEL)  # this process's own Serve client
    echo(f"loraserve: starting {cfg.model.id} ({cfg.deploy.num_replicas} replica(s))")
    if local:
        ray.init(include_dashboard=False, _temp_dir=ray_temp_dir(), logging_level=LOG_LEVEL)
    else:
        ray.init(address=cfg.deploy.ray_address, logging_level=LOG_LEVEL)
    try:
        serve.start(http_options={"host": host, "port": port}, logging_config=QUIET)
        try:
            serve.run(
                bind(cfg, keys),
                name=APP_NAME,
                route_prefix="/",
                blocking=False,
                logging_config=QUIET,
            )
            where = f"[{host}]" if ":" in host else host
            echo(f"loraserve: serving {cfg.model.id} on http://{where}:{port} (OpenAI API at /v1)")
            _wait_for_stop_signal()
            echo("loraserve: stopping: finishing requests in flight")
        finally:
            # Deleting the app drains it: each replica stops taking calls and finishes the
            # ones in flight (up to replica.DRAIN_TIMEOUT_S) while the HTTP proxy still
            # relays their streams. serve.shutdown() alone would kill the replicas at once.
            serve.delete(APP_NAME)
    finally:
        if local:  # a cluster's Serve may run other applications: only ours was removed
            serve.shutdown()
        ray.shutdown()


def _check_free(host: str, port: int) -> None:
    """OSError naming host:port unless it can be listened on (Ray's proxy would only log it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As the proxy's server sets it: a port in TIME_WAIT after a restart is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _wait_for_stop_signal() -> None:
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()
        # A second Ctrl-C while draining stops at once.
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):  # a timed wait lets the handler run promptly
            pass
    finally:
        for s, handler in previous.items():
            if signal.getsignal(s) is on_signal:
                signal.signal(s, handler)
