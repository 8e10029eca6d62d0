"""Damaged records: a meta.json or latest.json with a field of the wrong type is corrupted,
left out of every listing (logged and counted) and refused when named; parsing of names."""

from __future__ import annotations

import json
import logging

import pytest
from fsspec.core import url_to_fs

from adapters.errors import AdapterError, RegistryCorrupt
from adapters.registry.names import parse_version, split_model
from adapters.registry.registry import Registry
from tests.adapters.registry.helpers import make_adapter
from tests.adapters.registry.test_registry_legacy import write_legacy

BAD_META = [
    ("target_modules", 5),
    ("target_modules", ["q_proj", 5]),
    ("num_bytes", "x"),
    ("num_bytes", -1),
    ("rank", 0),
    ("rank", True),
    ("rank", 8.0),
    ("alpha", "16"),
    ("scale", None),
    ("has_draft", "no"),
    ("created", 5),
    ("variants", "use_dora"),
    ("variants", ["use_dora", 5]),
]
BAD_POINTER = [("updated", 5), ("owner", 5), ("name", None), ("digest", None)]


@pytest.fixture
def reg(uri):
    """acme's public "bad", its private "ok", and globex's "other"."""
    reg = Registry(uri)
    reg.publish("bad", make_adapter(seed=1), owner="acme")
    reg.publish("ok", make_adapter(seed=2), owner="acme")
    reg.publish("other", make_adapter(seed=3), owner="globex")
    reg.set_public("bad", "acme", True)
    return reg


def _listings(reg: Registry) -> tuple[list, list]:
    return [(e.name, e.owner) for e in reg.list()], [e.name for e in reg.list_visible("globex")]


@pytest.mark.parametrize(("key", "value"), BAD_META)
def test_a_meta_field_of_the_wrong_type_is_corrupted(reg, uri, key, value, caplog):
    fs, root = url_to_fs(uri)
    meta = f"{root}/versions/{make_adapter(seed=1).digest}/meta.json"
    fs.pipe_file(meta, json.dumps({**json.loads(fs.cat_file(meta)), key: value}).encode())
    with caplog.at_level(logging.WARNING, logger="loraserve.registry"):
        assert _listings(reg) == ([("ok", "acme"), ("other", "globex")], ["other"])
    assert reg.skipped == 2 and "tenants/acme/names/bad" in caplog.text
    for call in (
        lambda: reg.resolve("bad", "acme"),
        lambda: reg.show("bad", "acme"),
        lambda: reg.load(make_adapter(seed=1).digest),
    ):
        with pytest.raises(RegistryCorrupt):
            call()


@pytest.mark.parametrize(("key", "value"), BAD_POINTER)
def test_a_pointer_field_of_the_wrong_type_is_corrupted(reg, uri, key, value):
    fs, root = url_to_fs(uri)
    latest = f"{root}/tenants/acme/names/bad/latest.json"
    fs.pipe_file(latest, json.dumps({**json.loads(fs.cat_file(latest)), key: value}).encode())
    assert _listings(reg) == ([("ok", "acme"), ("other", "globex")], ["other"])
    assert reg.skipped == 2
    with pytest.raises(RegistryCorrupt):
        reg.show("bad", "acme")


@pytest.mark.parametrize(("key", "value"), BAD_POINTER)
def test_a_legacy_pointer_field_of_the_wrong_type_is_corrupted(uri, key, value):
    write_legacy(uri, "old", make_adapter(seed=4), "acme")
    fs, root = url_to_fs(uri)
    latest = f"{root}/names/old/latest.json"
    fs.pipe_file(latest, json.dumps({**json.loads(fs.cat_file(latest)), key: value}).encode())
    reg = Registry(uri)
    assert reg.list() == [] and reg.skipped == 1


def test_split_model():
    assert split_model("base:name") == ("base", "name")
    assert split_model("name") == (None, "name")
    assert split_model("org/base:v2:name") == ("org/base:v2", "name")
    assert split_model(":name") == ("", "name")
    assert split_model("base:") == ("base", "")


def test_parse_version():
    digest = "a" * 64
    assert parse_version(digest) == (None, None, digest)
    assert parse_version(f"bot@{digest}") == (None, "bot", digest)
    assert parse_version(f"acme/bot@{digest}") == ("acme", "bot", digest)
    for bad, why in [
        ("bot", "invalid adapter version"),
        ("bot@nothex", "invalid version 'nothex'"),
        (f"/bot@{digest}", "invalid tenant"),
        (f"a b/bot@{digest}", "invalid tenant"),
        (f"acme/Bot@{digest}", "invalid adapter name"),
        (f"a@b@{digest}", "invalid version"),
    ]:
        with pytest.raises(AdapterError, match=why):
            parse_version(bad)
