"""API keys as configured: who each key is (a tenant) and what it may do (scope user or admin).

Keys come from server.api_keys_file, one `KEY TENANT SCOPE` a line ('#' comments and
blank lines allowed), and from LORASERVE_API_KEYS=`KEY:TENANT:SCOPE,...`. A request sends
`Authorization: Bearer KEY`. With no keys configured every route is open and every caller
is the admin of tenant "default" (the server then binds only to loopback).

Rule (adapters.registry.visibility holds it): a key sees and uses its own tenant's adapters and the
public ones; it manages (uploads over, deletes) its own tenant's only. An admin key also
lists and manages every tenant's adapters and marks adapters public. The tenant `operator`
is reserved: it owns the operator's preloaded adapters, and no key may be given it.
Each key has a public id (`key-` and 12 hex digits of its SHA-256) that usage is metered by.
A key is at least MIN_KEY_LENGTH characters; a client sending many wrong ones is refused for
a while (serving.api.edge.key_guesses).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

from adapters.registry.names import OPERATOR
from serving.api.core.caller import Principal, key_id
from serving.config import ConfigError

log = logging.getLogger("loraserve.api")

SCOPES = ("user", "admin")
ENV_VAR = "LORASERVE_API_KEYS"
TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
KEY_RE = re.compile(r"^[\x21-\x7e]+\Z")  # printable ASCII without spaces: fits a header
MIN_KEY_LENGTH = 16  # as the Helm chart's values schema asks


def load_keys(
    api_keys_file: str | Path | None, env: Mapping[str, str] | None = None
) -> dict[str, Principal]:
    """All configured keys, from the file and the environment; ConfigError names bad lines."""
    env = os.environ if env is None else env
    keys: dict[str, Principal] = {}
    entries = []
    if api_keys_file is not None:
        entries += _file_entries(Path(api_keys_file))
    if env.get(ENV_VAR, "").strip():
        entries += _env_entries(env[ENV_VAR])
    for where, key, tenant, scope in entries:
        if key in keys and keys[key] != Principal(tenant, scope):
            raise ConfigError(f"{where}: this key is already given to another tenant or scope")
        keys[key] = Principal(tenant, scope, key_id(key))
    return keys


def _file_entries(path: Path) -> list[tuple[str, str, str, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: API keys file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the API keys file: {exc}") from None
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        _warn_shared(path, mode)
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        content = line.split("#", 1)[0].strip()
        if content:
            where = f"{path}, line {number}"
            entries.append((where, *_check(where, content.split())))
    return entries


@functools.cache  # once per file and mode: a start reads the keys more than once
def _warn_shared(path: Path, mode: int) -> None:
    log.warning("API keys file %s: group or others may read or write it (mode %03o): "
                "chmod 600 %s", path, mode, path)  # fmt: skip


def _env_entries(text: str) -> list[tuple[str, str, str, str]]:
    entries = []
    for number, item in enumerate(text.split(","), start=1):
        if item.strip():
            where = f"{ENV_VAR}, entry {number}"
            entries.append((where, *_check(where, item.strip().split(":"))))
    return entries


def _check(where: str, fields: list[str]) -> tuple[str, str, str]:
    if len(fields) != 3:
        raise ConfigError(f"{where}: expected KEY TENANT SCOPE, got {len(fields)} field(s)")
    key, tenant, scope = fields
    if not KEY_RE.match(key):
        raise ConfigError(f"{where}: a key must be printable ASCII without spaces")
    if not TENANT_RE.match(tenant):
        raise ConfigError(
            f"{where}: invalid tenant {tenant!r}: use 1-64 of A-Z, a-z, 0-9, '.', '_', '-'"
        )
    if tenant == OPERATOR:
        raise ConfigError(
            f"{where}: the tenant {OPERATOR!r} is reserved for the operator's preloaded adapters"
        )
    if scope not in SCOPES:
        raise ConfigError(f"{where}: scope must be user or admin, got {scope!r}")
    if len(key) < MIN_KEY_LENGTH:  # the message names the tenant: the key is a secret
        raise ConfigError(
            f"{where}: the key of tenant {tenant!r} is shorter than {MIN_KEY_LENGTH} "
            "characters: give it a random key at least that long (openssl rand -hex 24)"
        )
    return key, tenant, scope
