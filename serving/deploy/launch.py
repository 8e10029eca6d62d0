"""`loraserve serve`: start (or join) Ray, run the app, block until Ctrl-C or SIGTERM.

One command serves on one machine: with no `deploy.ray_address` a private local Ray starts
(no dashboard) and stops with the server. With an address, the app joins that cluster and
only its own application is removed at exit; the cluster keeps running.
"""

from __future__ import annotations

import functools
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

from serving.api.core.settings import settings_from_config
from serving.config import ServeConfig
from serving.deploy.app import APP_NAME, bind, publish_preloads
from serving.deploy.console import new_log_path, quiet_console
from serving.deploy.exposure import load_checked_keys
from serving.deploy.listener import check_proxy_disabled
from serving.engine.from_config import check_draft_vocab

# Ray puts unix sockets under its temp dir, and a socket path must stay under 107 bytes:
# beyond this many characters the session's socket paths would not fit.
MAX_TEMP_DIR_CHARS = 40
# Serve's actors log every request at INFO: the log file gets their warnings and errors only
# (Ray's session folder keeps the full logs).
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


def serve_until_stopped(cfg: ServeConfig, echo: Callable[..., None] = print) -> None:
    """Publish preloads, run the app on server.host:port, block until a signal, then drain.

    `echo` prints one of our lines, as print does (it is given file=, the terminal, while
    Ray's own output goes to the log file that the second line names).
    """
    host, port = cfg.server.host, cfg.server.port
    # Before Ray starts, so a keyless public host, a bad model folder or adapter fails in a
    # second with its own message, rather than as a replica that failed to deploy.
    keys = load_checked_keys(cfg)
    settings_from_config(cfg)
    check_draft_vocab(cfg)
    publish_preloads(cfg)
    local = cfg.deploy.ray_address is None
    if local:  # on a cluster the replicas listen on their own nodes, not necessarily here
        _check_free(host, port)
    log_path = new_log_path()
    echo(f"loraserve: starting {cfg.model.id} ({cfg.deploy.num_replicas} replica(s))")
    echo(f"loraserve: Ray logs in {log_path}")
    with quiet_console(log_path) as terminal:
        _serve_on_ray(cfg, keys, functools.partial(echo, file=terminal))


def _serve_on_ray(cfg: ServeConfig, keys, echo: Callable[[str], None]) -> None:
    """Start or join Ray, run the app until a signal, then drain it and leave Ray."""
    local = cfg.deploy.ray_address is None
    # The driver logs at INFO into the log file; the actors stay at WARNING (QUIET), as
    # at INFO the replicas would log a line per request.
    logging.getLogger("ray.serve").setLevel(logging.INFO)  # this process's own Serve client
    # The handlers go in before Ray starts: a first Ctrl-C stops gently from any point,
    # while Ray starts (interrupting ray.init would leave its processes behind) or before
    # serve.run returns (/readyz may already answer 200), not only once serving.
    with _StopSignals() as stop:
        if local:
            ray.init(include_dashboard=False, _temp_dir=ray_temp_dir(), logging_level=logging.INFO)
        else:
            ray.init(address=cfg.deploy.ray_address, logging_level=logging.INFO)
        stop.arm(signal.SIGTERM)  # ray.init put in its own, which exits at once
        try:
            if not stop.requested.is_set():
                _serve_app(cfg, keys, echo, stop.requested)
        finally:
            if local:  # a cluster's Serve may run other applications: only ours was removed
                serve.shutdown()
            ray.shutdown()
    echo("loraserve: stopped")


def _serve_app(cfg: ServeConfig, keys, echo: Callable[[str], None], stop: threading.Event):
    """Run the app on server.host:port until `stop` is set, then drain it."""
    host, port = cfg.server.host, cfg.server.port
    # No HTTP proxy: each replica listens on host:port itself (serving.deploy.listener). On a
    # cluster whose Serve already runs, its settings stay; one with proxies fails here, in a
    # second, rather than as replicas that load the model and then refuse to start.
    serve.start(proxy_location="Disabled", logging_config=QUIET)
    check_proxy_disabled()
    try:
        serve.run(
            bind(cfg, keys), name=APP_NAME, route_prefix="/", blocking=False, logging_config=QUIET
        )
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        echo(f"loraserve: serving {cfg.model.id} on {url} (OpenAI API at /v1)")
        while not stop.wait(0.5):  # a timed wait lets the handler run promptly
            pass
        echo("loraserve: stopping: finishing requests in flight")
    finally:
        # Deleting the app drains it: each replica stops accepting connections and finishes
        # the streams in flight (up to replica.DRAIN_TIMEOUT_S). serve.shutdown() alone
        # would kill the replicas at once.
        serve.delete(APP_NAME)


def _check_free(host: str, port: int) -> None:
    """OSError naming host:port unless it can be listened on (a replica would only log it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As the replicas' listeners set it: a port in TIME_WAIT after a restart is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


class _StopSignals:
    """While entered, the first SIGINT or SIGTERM sets `requested`; a second SIGINT raises
    KeyboardInterrupt (stop at once)."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _StopSignals:
        for s in (signal.SIGINT, signal.SIGTERM):
            self.arm(s)
        return self

    def arm(self, signum: int) -> None:
        previous = signal.signal(signum, self._on_signal)
        self._previous.setdefault(signum, previous)

    def _on_signal(self, signum, frame) -> None:
        # Set from another thread: the handler runs in the main thread, which may hold the
        # event's lock at that moment (Event.wait retakes it on each timeout), and set()
        # here would then wait on that lock forever.
        threading.Thread(target=self.requested.set, daemon=True).start()
        # A second Ctrl-C, while starting or draining, stops at once.
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
