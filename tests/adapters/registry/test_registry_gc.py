"""Garbage collection: versions nothing refers to or leases go after the grace period;
referenced, leased and recent ones stay; dry_run removes nothing."""

from __future__ import annotations

import json
import time

import pytest
from fsspec.core import url_to_fs

from adapters.errors import AdapterError, UnknownAdapter
from adapters.registry.registry import Registry
from tests.adapters.registry.helpers import assert_consistent, make_adapter, snapshot
from tests.adapters.registry.test_registry_legacy import write_legacy

DAY = 86400.0


def later(days: float = 2) -> float:
    return time.time() + days * DAY


def stored(uri: str) -> set[str]:
    return {p.split("/")[2] for p in snapshot(uri) if p.startswith("/versions/")}


@pytest.fixture
def reg(uri):
    """'gone' (two versions) deleted; 'kept' with two versions; 'legacy' in the old layout."""
    reg = Registry(uri)
    reg.publish("gone", make_adapter(seed=1), owner="acme")
    reg.publish("gone", make_adapter(seed=2), owner="acme")
    reg.delete("gone", "acme")
    reg.publish("kept", make_adapter(seed=3), owner="acme")
    reg.publish("kept", make_adapter(seed=4), owner="acme")
    write_legacy(uri, "legacy", make_adapter(seed=5), "globex")
    return reg


GONE = {make_adapter(seed=s).digest for s in (1, 2)}
KEPT = {make_adapter(seed=s).digest for s in (3, 4, 5)}


def test_a_deleted_names_versions_go_after_the_grace(reg, uri):
    assert reg.gc() == [] and reg.gc(now=later(0.5)) == []
    assert stored(uri) == GONE | KEPT
    assert sorted(reg.gc(now=later())) == sorted(GONE)
    assert stored(uri) == KEPT
    for digest in GONE:
        with pytest.raises(UnknownAdapter, match="unknown version"):
            reg.load(digest)
    assert reg.gc(now=later(30)) == []  # referenced by pointers and histories, in both layouts
    assert_consistent(uri)


def test_dry_run_removes_nothing(reg, uri):
    before = snapshot(uri)
    assert sorted(reg.gc(now=later(), dry_run=True)) == sorted(GONE)
    assert snapshot(uri) == before


def test_leases_keep_versions_while_fresh(reg, uri):
    leased = make_adapter(seed=1)
    reg.write_lease("replica-1", [f"acme/gone@{leased.digest}"])
    reg.write_lease("replica-2", [])
    now = later()
    assert reg.gc(now=now, lease_ttl_s=3 * DAY) == [make_adapter(seed=2).digest]
    assert leased.digest in stored(uri)
    reg.load(leased.digest)  # a replica can still load what it serves
    # Once the lease is stale, the version and the lease files go.
    assert reg.gc(now=now, lease_ttl_s=600) == [leased.digest]
    assert not [p for p in snapshot(uri) if p.startswith("/leases/")]
    reg.write_lease("replica-1", [leased.digest])
    reg.drop_lease("replica-1")
    assert not [p for p in snapshot(uri) if p.startswith("/leases/")]


def test_lease_holders_and_digests_are_checked(reg):
    with pytest.raises(AdapterError, match="invalid lease holder"):
        reg.write_lease("../x", [])
    with pytest.raises(AdapterError, match="not a version digest"):
        reg.write_lease("replica-1", ["acme/gone@latest"])


def test_a_republished_version_is_referenced_again(reg, uri):
    reg.publish("back", make_adapter(seed=1), owner="acme")
    assert reg.gc(now=later()) == [make_adapter(seed=2).digest]
    reg.load(reg.resolve("back", "acme").qualified)


def test_incomplete_versions_go_by_their_files_age(uri):
    reg = Registry(uri)
    pending = make_adapter(seed=7)
    fs, root = url_to_fs(uri)
    fs.makedirs(f"{root}/versions/{pending.digest}", exist_ok=True)
    fs.pipe_file(f"{root}/versions/{pending.digest}/adapter_config.json", pending.config_bytes)
    assert reg.gc(grace_s=60) == []
    assert reg.gc(grace_s=60, now=time.time() + 120) == [pending.digest]
    assert stored(uri) == set()


def test_a_crashed_create_is_debris(uri):
    """A claim and history entry without a pointer: gone after the claim's TTL, then its version."""
    reg = Registry(uri)
    orphan = make_adapter(seed=8)
    reg.publish("x", orphan, owner="acme")
    fs, root = url_to_fs(uri)
    folder = f"{root}/tenants/acme/names/x"
    fs.rm(f"{folder}/latest.json")
    assert reg.gc(grace_s=0) == []  # its claim is fresh: a create may be under way
    claim = json.loads(fs.cat_file(f"{folder}/claim"))
    fs.pipe_file(
        f"{folder}/claim", json.dumps({**claim, "created": claim["created"] - 120}).encode()
    )
    assert reg.gc(grace_s=0, dry_run=True) == [orphan.digest]
    assert fs.exists(f"{folder}/claim")
    assert reg.gc(grace_s=0) == [orphan.digest]
    assert not fs.exists(folder)
    # The name can be created again at once.
    assert reg.publish("x", make_adapter(seed=9), owner="acme", create_only=True).owner == "acme"
