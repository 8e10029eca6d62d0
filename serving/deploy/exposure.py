"""Fail closed: a server with no API keys serves loopback only, however it was started.

With no keys every caller is an admin, so such a server must be unreachable from other
machines unless the operator says otherwise (server.insecure: true, or `--insecure`).

Rule: with no keys and not insecure, every host the app listens on must be loopback
(127.0.0.0/8, ::1, localhost). The app listens on the config's server.host only: each
ModelServer replica serves it there itself, and Ray Serve runs no HTTP proxy (a replica
refuses to start beside one: serving.deploy.listener). The rule is applied three times: by
`loraserve serve` before Ray starts, by the builder (`serve run`, KubeRay), and by every
replica before it listens.

Keys are read once, where the app is built (the driver, or the builder's task under
KubeRay): LORASERVE_API_KEYS there and server.api_keys_file there. The builder passes them
to the replicas as an argument, so no replica depends on its own environment or files.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from adapters.registry.names import OPERATOR
from serving.api.core.caller import Principal
from serving.api.core.keys_file import ENV_VAR, load_keys
from serving.api.edge.gate import is_loopback as gate_is_loopback
from serving.config import ServeConfig

log = logging.getLogger("loraserve")


class OpenServerError(ValueError):
    """A keyless server would listen beyond loopback without server.insecure."""


def is_loopback(host: str) -> bool:
    """Whether host is a loopback address or `localhost`, bracketed IPv6 allowed (gate's rule)."""
    return gate_is_loopback(host.strip("[]"))


def check_open_server(
    hosts: Iterable[str | None], keys: Mapping[str, Principal], insecure: bool
) -> None:
    """OpenServerError unless keys exist, insecure is set, or every host is loopback.

    A host of None is a listener that is switched off.
    """
    if keys or insecure:
        return
    exposed = [h for h in hosts if h is not None and not is_loopback(h)]
    if exposed:
        raise OpenServerError(
            f"refusing to serve on {exposed[0]} with no API keys configured: set "
            f"server.api_keys_file or {ENV_VAR}, or server.insecure: true (--insecure)"
        )


def load_checked_keys(cfg: ServeConfig) -> dict[str, Principal]:
    """This process's keys (env and server.api_keys_file); OpenServerError per the rule.
    Warns of limits.tenants entries that name no key's tenant: a typo ('Bob' for 'bob')
    would otherwise leave the tenant on the defaults without a word."""
    keys = load_keys(cfg.server.api_keys_file)
    check_open_server([cfg.server.host], keys, cfg.server.insecure)
    tenants = {p.tenant for p in keys.values()} | {OPERATOR}
    for name in sorted(set(cfg.limits.tenants) - tenants) if keys else ():
        log.warning("limits.tenants.%s: no API key belongs to a tenant of that name, so its "
                    "limits apply to no one yet (tenants: %s)", name, ", ".join(sorted(tenants)))  # fmt: skip
    return keys
