"""Registries written before tenants (every name under names/<name>, its owner in the
pointer) are listed, resolved, loaded, shown, deleted and published to in place."""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone

import pytest
from fsspec.core import url_to_fs

from adapters.errors import RegistryCorrupt, UnknownAdapter
from adapters.registry.registry import Registry
from adapters.registry.visibility import manageable, resolve_for, visible_entry
from tests.adapters.registry.helpers import (
    assert_consistent,
    assert_same_adapter,
    make_adapter,
    snapshot,
)


def _json(value: dict) -> bytes:
    return json.dumps(value, indent=2, sort_keys=True).encode()


def write_legacy(uri: str, name: str, adapter, owner: str) -> None:
    """What Registry.publish wrote before tenants, file for file."""
    fs, root = url_to_fs(uri)
    folder = f"{root}/versions/{adapter.digest}"
    fs.makedirs(folder, exist_ok=True)
    parts = [("", adapter)] + ([("draft_", adapter.draft)] if adapter.draft else [])
    for prefix, part in parts:
        fs.pipe_file(f"{folder}/{prefix}adapter_config.json", part.config_bytes)
        fs.pipe_file(f"{folder}/{prefix}adapter_model.safetensors", part.weights_bytes)
    now = datetime.now(timezone.utc).isoformat(timespec="microseconds")
    meta = {
        "digest": adapter.digest,
        "rank": adapter.rank,
        "alpha": adapter.alpha,
        "scale": adapter.scale,
        "target_modules": list(adapter.target_modules),
        "num_bytes": adapter.num_bytes,
        "has_draft": adapter.draft is not None,
        "created": now,
    }
    if not fs.exists(f"{folder}/meta.json"):
        fs.pipe_file(f"{folder}/meta.json", _json(meta))
    fs.makedirs(f"{root}/names/{name}/history", exist_ok=True)
    fs.pipe_file(f"{root}/names/{name}/history/{adapter.digest}", b"")
    pointer = {"name": name, "digest": adapter.digest, "owner": owner, "updated": now}
    fs.pipe_file(f"{root}/names/{name}/latest.json", _json(pointer))
    time.sleep(0.002)  # distinct "created" times order the history


OLD, NEW, SQL = make_adapter(seed=11), make_adapter(seed=12), make_adapter(seed=13, draft_seed=14)


@pytest.fixture
def legacy(uri):
    """acme's support-bot (two versions) and the default tenant's sql, with a draft."""
    write_legacy(uri, "support-bot", OLD, "acme")
    write_legacy(uri, "support-bot", NEW, "acme")
    write_legacy(uri, "sql", SQL, "default")
    return uri


def test_list_resolve_load_show(legacy):
    reg = Registry(legacy)
    assert [(e.name, e.owner, e.digest) for e in reg.list()] == [
        ("sql", "default", SQL.digest),
        ("support-bot", "acme", NEW.digest),
    ]
    assert [e.name for e in reg.list("acme")] == ["support-bot"]
    assert reg.exists("support-bot", "acme") and not reg.exists("support-bot")
    latest = reg.resolve("support-bot", "acme")
    assert (latest.owner, latest.digest) == ("acme", NEW.digest)
    assert reg.resolve(f"support-bot@{OLD.digest}", "acme").digest == OLD.digest
    with pytest.raises(UnknownAdapter, match=r"^unknown adapter 'support-bot'$"):
        reg.resolve("support-bot", "globex")
    assert_same_adapter(reg.load(latest.qualified), NEW)
    assert_same_adapter(reg.load(f"support-bot@{OLD.digest}"), OLD)
    loaded = reg.load("sql")  # a bare name: the default tenant's
    assert_same_adapter(loaded, SQL)
    assert_same_adapter(loaded.draft, SQL.draft)
    entry = reg.show("support-bot", "acme")
    assert entry.history == (NEW.digest, OLD.digest) and entry.owner == "acme"


def test_publish_moves_a_legacy_name(legacy):
    reg = Registry(legacy)
    newest = make_adapter(seed=15)
    version = reg.publish("support-bot", newest, owner="acme")
    assert (version.owner, version.digest) == ("acme", newest.digest)
    files = snapshot(legacy)
    assert not [p for p in files if p.startswith("/names/support-bot/")]
    assert f"/tenants/acme/names/support-bot/history/{OLD.digest}" in files
    assert reg.show("support-bot", "acme").history == (newest.digest, NEW.digest, OLD.digest)
    assert reg.resolve(f"support-bot@{OLD.digest}", "acme").digest == OLD.digest
    assert [(e.name, e.owner) for e in reg.list()] == [
        ("sql", "default"),
        ("support-bot", "acme"),
    ]
    # Republishing the legacy latest moves the name too, without a new version.
    assert reg.publish("sql", SQL).digest == SQL.digest
    assert not [p for p in snapshot(legacy) if p.startswith("/names/")]
    assert reg.show("sql").history == (SQL.digest,)
    assert_consistent(legacy)


def test_another_tenant_gets_its_own_name(legacy):
    reg = Registry(legacy)
    reg.publish("support-bot", make_adapter(seed=16), owner="globex")
    assert [(e.name, e.owner) for e in reg.list() if e.name == "support-bot"] == [
        ("support-bot", "acme"),
        ("support-bot", "globex"),
    ]
    assert reg.resolve("support-bot", "acme").digest == NEW.digest
    assert "/names/support-bot/latest.json" in snapshot(legacy)


def test_delete(legacy):
    reg = Registry(legacy)
    with pytest.raises(UnknownAdapter):
        reg.delete("support-bot", "globex")
    reg.delete("sql")
    reg.delete("support-bot", "acme")
    assert reg.list() == []
    assert not [p for p in snapshot(legacy) if "/names/" in p]
    assert_same_adapter(reg.load(SQL.digest), SQL)  # versions stay


def test_a_half_moved_name_is_listed_once(legacy):
    """A crash after the new pointer but before the legacy folder went: both exist."""
    reg = Registry(legacy)
    fs, root = url_to_fs(legacy)
    saved = {p: fs.cat_file(p) for p in fs.find(f"{root}/names/support-bot")}
    reg.publish("support-bot", make_adapter(seed=17), owner="acme")
    for path, data in saved.items():
        fs.makedirs(path.rpartition("/")[0], exist_ok=True)
        fs.pipe_file(path, data)
    assert [(e.name, e.owner, e.digest) for e in reg.list("acme")] == [
        ("support-bot", "acme", make_adapter(seed=17).digest)
    ]
    reg.delete("support-bot", "acme")
    assert reg.list("acme") == []
    assert not [p for p in snapshot(legacy) if "support-bot" in p]


def test_an_unreadable_legacy_pointer_answers_as_a_missing_name(legacy, caplog):
    """Its owner is unknown: telling it from a missing name would show every tenant it exists."""
    reg = Registry(legacy)
    fs, root = url_to_fs(legacy)
    write_legacy(legacy, "secret", make_adapter(seed=18), "acme")
    fs.pipe_file(f"{root}/names/secret/latest.json", b"{broken")
    calls = {
        "show": lambda n: reg.show(n, "globex"),
        "resolve": lambda n: reg.resolve(n, "globex"),
        "resolve_for": lambda n: resolve_for(reg, "globex", n),
        "visible_entry": lambda n: visible_entry(reg, "globex", False, n),
        "manageable": lambda n: manageable(reg, "ops", True, n),
        "set_public": lambda n: reg.set_public(n, "acme", True),
    }
    with caplog.at_level(logging.WARNING, logger="loraserve.registry"):
        for what, call in calls.items():
            with pytest.raises(UnknownAdapter) as hidden:
                call("secret")
            with pytest.raises(UnknownAdapter) as missing:
                call("nosuch")
            assert str(hidden.value) == str(missing.value).replace("nosuch", "secret"), what
    assert not reg.exists("secret", "acme") and reg.skipped > 0
    assert "names/secret" in caplog.text
    assert [e.name for e in reg.list()] == ["sql", "support-bot"]
    # Another tenant may take the name; it gets a folder of its own.
    assert reg.publish("secret", make_adapter(seed=19), owner="globex").owner == "globex"
    assert reg.show("secret", "globex").owner == "globex"


def test_an_unreadable_pointer_of_ones_own_name_is_reported(legacy):
    reg = Registry(legacy)
    reg.publish("mine", make_adapter(seed=18), owner="globex")
    fs, root = url_to_fs(legacy)
    fs.pipe_file(f"{root}/tenants/globex/names/mine/latest.json", b"{broken")
    for call in (lambda: reg.show("mine", "globex"), lambda: reg.resolve("mine", "globex")):
        with pytest.raises(RegistryCorrupt):
            call()


def test_an_unreadable_legacy_name_can_be_deleted(legacy):
    reg = Registry(legacy)
    fs, root = url_to_fs(legacy)
    for name in ("secret", "twin"):
        write_legacy(legacy, name, make_adapter(seed=18), "acme")
        fs.pipe_file(f"{root}/names/{name}/latest.json", b"{broken")
    # A tenant's own name of that name is what deleting it removes; the legacy folder stays.
    reg.publish("twin", make_adapter(seed=19), owner="globex")
    reg.delete("twin", "globex")
    assert "/names/twin/latest.json" in snapshot(legacy)
    reg.delete("secret", "ops")
    assert not [p for p in snapshot(legacy) if "secret" in p]
    with pytest.raises(UnknownAdapter):
        reg.delete("secret", "ops")
    reg.delete("twin", "ops")
    assert not [p for p in snapshot(legacy) if "twin" in p]
    assert_same_adapter(reg.load(make_adapter(seed=18).digest), make_adapter(seed=18))
