"""The adapter registry on file:// and memory://: round trips, versions, tenants, delete,
refusals that change nothing, incomplete, corrupted and repaired versions."""

from __future__ import annotations

import json

import fsspec
import pytest
from fsspec.core import url_to_fs

from adapters.errors import AdapterError, NameConflict, UnknownAdapter
from adapters.format.adapter import parse_adapter
from adapters.registry.records import Entry, Version
from adapters.registry.registry import Registry
from tests.adapters.factory import peft_adapter_files
from tests.adapters.registry.helpers import (
    assert_same_adapter,
    make_adapter,
    snapshot,
)

BAD_NAMES = ["Bad", "../x", "a:b", "", "x" * 65, "base", "a/b", "x\n", "x\n\n"]


def test_plain_folder_is_a_local_registry(tmp_path):
    reg = Registry(str(tmp_path / "plain"))
    reg.publish("x", make_adapter())
    assert (tmp_path / "plain" / "tenants" / "default" / "names" / "x" / "latest.json").is_file()


def test_round_trip(uri):
    reg = Registry(uri)
    adapter = make_adapter()
    version = reg.publish("support-bot", adapter, owner="alice")
    assert isinstance(version, Version)
    assert (version.name, version.digest, version.owner) == ("support-bot", adapter.digest, "alice")
    assert version.ref == f"support-bot@{adapter.digest}"
    assert version.qualified == f"alice/support-bot@{adapter.digest}" and not version.public
    assert (version.rank, version.scale, version.num_bytes) == (8, 2.0, adapter.num_bytes)
    assert version.target_modules == adapter.target_modules and not version.has_draft
    assert Registry(uri).resolve("support-bot", "alice") == version
    for loaded in (version.qualified, version.ref, version.digest):
        assert_same_adapter(Registry(uri).load(loaded), adapter)


def test_round_trip_with_draft(uri):
    reg = Registry(uri)
    adapter = make_adapter(seed=1, draft_seed=2)
    assert reg.publish("spec", adapter).has_draft
    files = snapshot(uri)
    for name in ("draft_adapter_config.json", "draft_adapter_model.safetensors"):
        assert f"/versions/{adapter.digest}/{name}" in files
    loaded = reg.load("spec")
    assert_same_adapter(loaded, adapter)
    assert_same_adapter(loaded.draft, adapter.draft)


def test_republish_identical_is_a_no_op(uri):
    reg = Registry(uri)
    first = reg.publish("a", make_adapter())
    before = snapshot(uri)
    assert reg.publish("a", make_adapter()) == first
    assert snapshot(uri) == before
    # The same content under a second name is the same single version.
    reg.publish("b", make_adapter())
    assert {p.split("/")[2] for p in snapshot(uri) if p.startswith("/versions/")} == {first.digest}


def test_new_content_moves_the_pointer_and_old_versions_stay(uri):
    reg = Registry(uri)
    old, new = make_adapter(seed=0), make_adapter(seed=1)
    v1 = reg.publish("a", old)
    v2 = reg.publish("a", new)
    assert v1.digest != v2.digest
    assert reg.resolve("a").digest == new.digest
    assert reg.resolve(v1.ref).digest == old.digest
    assert_same_adapter(reg.load(v1.ref), old)
    assert_same_adapter(reg.load("a"), new)
    assert reg.show("a").history == (v2.digest, v1.digest)


@pytest.mark.parametrize("tenant", ["", "a b", "../x", "x/y", "-x", "t" * 65, None, "t\n"])
def test_invalid_tenants_change_nothing(uri, tenant):
    reg = Registry(uri)
    reg.publish("good", make_adapter())
    before = snapshot(uri)
    for call in (
        lambda: reg.publish("a", make_adapter(seed=1), owner=tenant),
        lambda: reg.resolve("good", tenant),
        lambda: reg.show("good", tenant),
        lambda: reg.delete("good", tenant),
        lambda: reg.exists("good", tenant),
        lambda: reg.list(tenant or ""),
        lambda: reg.load(f"{tenant or ''}/good@{'0' * 64}"),
    ):
        with pytest.raises(AdapterError, match="invalid tenant"):
            call()
    assert snapshot(uri) == before


def test_create_only(uri):
    reg = Registry(uri)
    reg.publish("a", make_adapter(seed=0), create_only=True)
    before = snapshot(uri)
    with pytest.raises(NameConflict, match="'a' already exists"):
        reg.publish("a", make_adapter(seed=1), create_only=True)
    assert snapshot(uri) == before
    assert reg.publish("a", make_adapter(seed=0), owner="bob", create_only=True).owner == "bob"


def test_list_and_show(uri):
    reg = Registry(uri)
    assert reg.list() == []
    adapter = make_adapter(rank=4)
    reg.publish("zeta", make_adapter(seed=3))
    reg.publish("alpha", adapter, owner="carol")
    entries = reg.list()
    assert [e.name for e in entries] == ["alpha", "zeta"]
    alpha = entries[0]
    assert (alpha.digest, alpha.owner, alpha.rank) == (adapter.digest, "carol", 4)
    assert (alpha.target_modules, alpha.num_bytes) == (("q_proj", "v_proj"), adapter.num_bytes)
    assert alpha.updated and alpha.history == ()
    assert reg.show("alpha", "carol") == Entry(**{**alpha.__dict__, "history": (adapter.digest,)})
    assert reg.exists("alpha", "carol") and not reg.exists("alpha") and not reg.exists("beta")


def test_delete(uri):
    reg = Registry(uri)
    version = reg.publish("a", make_adapter())
    loaded = reg.load("a")
    reg.delete("a")
    assert not reg.exists("a") and reg.list() == []
    for ref in ("a", version.ref):
        with pytest.raises(UnknownAdapter, match="unknown adapter 'a'"):
            reg.resolve(ref)
    assert_same_adapter(loaded, make_adapter())
    # A replica may still load the version it serves: versions outlive their names.
    assert_same_adapter(reg.load(version.qualified), make_adapter())
    files = snapshot(uri)
    assert f"/versions/{version.digest}/meta.json" in files
    assert not [p for p in files if "/names/a/" in p]
    with pytest.raises(UnknownAdapter, match="unknown adapter 'a'"):
        reg.delete("a")
    assert reg.publish("a", make_adapter(), owner="someone-else").owner == "someone-else"


@pytest.mark.parametrize("name", BAD_NAMES)
def test_invalid_names_change_nothing(uri, name):
    reg = Registry(uri)
    reg.publish("good", make_adapter())
    before = snapshot(uri)
    for call in (
        lambda: reg.publish(name, make_adapter(seed=1)),
        lambda: reg.resolve(name),
        lambda: reg.load(name),
        lambda: reg.show(name),
        lambda: reg.delete(name),
        lambda: reg.exists(name),
    ):
        with pytest.raises(AdapterError, match="invalid adapter name"):
            call()
    assert snapshot(uri) == before


def test_unknown_and_malformed_refs(uri):
    reg = Registry(uri)
    version = reg.publish("a", make_adapter())
    for call in (reg.resolve, reg.load, reg.show, reg.delete):
        with pytest.raises(UnknownAdapter, match="unknown adapter 'nope'"):
            call("nope")
    with pytest.raises(UnknownAdapter, match="unknown version"):
        reg.resolve("a@" + "0" * 64)
    for missing in ("0" * 64, "a@" + "0" * 64, "t/a@" + "0" * 64):
        with pytest.raises(UnknownAdapter, match="unknown version"):
            reg.load(missing)
    with pytest.raises(AdapterError, match="invalid version 'nothex'"):
        reg.load("x@nothex")
    with pytest.raises(AdapterError, match="invalid version"):
        reg.resolve("a@" + version.digest.upper())
    with pytest.raises(AdapterError, match="expected an Adapter"):
        reg.publish("b", {"adapter_config.json": b"{}"})
    with pytest.raises(AdapterError, match="draft of its own"):
        reg.publish("b", parse_adapter(peft_adapter_files(), draft=make_adapter(draft_seed=1)))


def test_incomplete_version_is_not_served(uri):
    reg = Registry(uri)
    first = reg.publish("a", make_adapter(seed=0))
    pending = make_adapter(seed=1)
    fs, root = url_to_fs(uri)
    # A version's files without meta.json (its publisher crashed), which the name refers to.
    for file, data in (
        ("adapter_config.json", pending.config_bytes),
        ("adapter_model.safetensors", pending.weights_bytes),
    ):
        fs.makedirs(f"{root}/versions/{pending.digest}", exist_ok=True)
        fs.pipe_file(f"{root}/versions/{pending.digest}/{file}", data)
    folder = f"{root}/tenants/default/names/a"
    fs.pipe_file(f"{folder}/history/{pending.digest}", b"")
    with pytest.raises(UnknownAdapter, match="incomplete"):
        reg.resolve(f"a@{pending.digest}")
    with pytest.raises(UnknownAdapter, match="incomplete"):
        reg.load(pending.digest)
    assert reg.resolve("a") == first
    pointer = json.dumps({"name": "a", "digest": pending.digest, "owner": "default", "updated": ""})
    fs.pipe_file(f"{folder}/latest.json", pointer.encode())
    with pytest.raises(UnknownAdapter, match="incomplete"):
        reg.load("a")
    # Publishing that content again completes the version.
    assert reg.publish("a", pending).digest == pending.digest
    assert_same_adapter(reg.load("a"), pending)


def test_corrupted_version_is_refused(uri):
    reg = Registry(uri)
    version = reg.publish("a", make_adapter())
    fs, root = url_to_fs(uri)
    config = f"{root}/versions/{version.digest}/adapter_config.json"
    fs.pipe_file(config, fs.cat_file(config).replace(b'"lora_alpha": 16', b'"lora_alpha": 17'))
    with pytest.raises(AdapterError, match="corrupted"):
        reg.load("a")
    # The trusted hot path skips the hash, but not the structure: a truncated file fails.
    weights = f"{root}/versions/{version.digest}/adapter_model.safetensors"
    fs.pipe_file(weights, fs.cat_file(weights)[:-10])
    with pytest.raises(AdapterError, match="lies about its offsets"):
        reg.load("a", verify=False)


@pytest.mark.parametrize("damage", ["remove", "truncate", "flip", "meta"])
def test_republishing_identical_content_repairs_the_version(uri, damage):
    reg = Registry(uri)
    adapter = make_adapter(seed=3, draft_seed=4)
    version = reg.publish("a", adapter)
    fs, root = url_to_fs(uri)
    folder = f"{root}/versions/{version.digest}"
    target = f"{folder}/draft_adapter_model.safetensors"
    if damage == "remove":
        fs.rm(target)
    elif damage == "truncate":
        fs.pipe_file(target, fs.cat_file(target)[:-10])
    elif damage == "flip":
        data = bytearray(fs.cat_file(f"{folder}/adapter_model.safetensors"))
        data[-1] ^= 0xFF  # the values, which only verify=True hashes
        fs.pipe_file(f"{folder}/adapter_model.safetensors", bytes(data))
    else:
        fs.pipe_file(f"{folder}/meta.json", b"{half")
    with pytest.raises(AdapterError):
        reg.load("a", verify=True)
    assert reg.publish("a", adapter).digest == version.digest
    assert_same_adapter(reg.load("a", verify=True), adapter)
    assert_same_adapter(reg.load(version.qualified, verify=True).draft, adapter.draft)


def test_unopenable_registry():
    with pytest.raises(AdapterError, match="cannot open"):
        Registry("nosuchprotocol://x")


def test_memory_roots_are_cleaned_up():
    fs = fsspec.filesystem("memory")
    assert not [p for p in fs.store if p.startswith("/registry-test-")]
    assert not [p for p in fs.pseudo_dirs if p.startswith("/registry-test-")]
