"""Storage failures: an OSError at any write of a publish leaves the registry serving what it
served before, and a retry succeeds; backend errors are RegistryUnavailable; corrupted
entries are left out of listings, counted and logged."""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager

import pytest
from fsspec.core import url_to_fs

import adapters.registry.store
from adapters.errors import AdapterError, RegistryUnavailable
from adapters.registry.registry import Registry
from tests.adapters.registry.helpers import assert_consistent, make_adapter, snapshot, state
from tests.adapters.registry.test_registry_legacy import write_legacy


class Plan:
    """Fail the fail_at-th mutating call (a write, open for writing, mv or makedirs)."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at, self.calls = fail_at, 0
        self.armed = False  # opening the registry is not part of the publish

    def tick(self, what: str) -> bool:
        if not self.armed:
            return False
        self.calls += 1
        return self.calls == self.fail_at


def faulty(fs, plan: Plan):
    """fs as an instance of a subclass of its own class whose mutating calls follow plan."""

    class Faulty(type(fs)):
        def pipe_file(self, path, value, *args, **kwargs):
            if plan.tick("pipe_file"):
                super().pipe_file(path, value[: len(value) // 2])  # a torn write
                raise OSError(f"injected failure writing {path}")
            return super().pipe_file(path, value, *args, **kwargs)

        def open(self, path, mode="rb", *args, **kwargs):
            if set(mode) & set("wxa") and plan.tick("open"):
                raise OSError(f"injected failure opening {path}")
            return super().open(path, mode, *args, **kwargs)

        def mv(self, *args, **kwargs):
            if plan.tick("mv"):
                raise OSError("injected failure renaming")
            return super().mv(*args, **kwargs)

        def makedirs(self, path, *args, **kwargs):
            if plan.tick("makedirs"):
                raise OSError(f"injected failure creating {path}")
            return super().makedirs(path, *args, **kwargs)

    Faulty.__name__ = f"Faulty{type(fs).__name__}"
    return Faulty(**fs.storage_options)


@contextmanager
def failing_registry(monkeypatch, uri: str, plan: Plan):
    """A Registry of uri whose filesystem follows plan."""
    opened = adapters.registry.store.url_to_fs
    with monkeypatch.context() as m:
        m.setattr(
            adapters.registry.store, "url_to_fs", lambda u, **kw: _wrapped(opened(u, **kw), plan)
        )
        reg = Registry(uri)
    plan.armed = True
    yield reg


def _wrapped(opened, plan):
    fs, root = opened
    return faulty(fs, plan), root


def _setup_existing(uri):
    reg = Registry(uri)
    reg.publish("kept", make_adapter(seed=1), owner="acme")
    reg.publish("bot", make_adapter(seed=2), owner="acme")


def _setup_legacy(uri):
    write_legacy(uri, "bot", make_adapter(seed=2), "acme")
    Registry(uri).publish("kept", make_adapter(seed=1), owner="acme")


SCENARIOS = {
    "create": (_setup_existing, "new-bot", make_adapter(seed=3, draft_seed=4)),
    "update": (_setup_existing, "bot", make_adapter(seed=5)),
    "reuse": (_setup_existing, "bot", make_adapter(seed=1)),  # content stored under "kept"
    "legacy": (_setup_legacy, "bot", make_adapter(seed=6)),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_publish_failing_at_any_write(uri, monkeypatch, scenario):
    setup, name, adapter = SCENARIOS[scenario]
    for k in range(1, 200):
        root = f"{uri}/k{k}"
        setup(root)
        before = state(Registry(root))
        plan = Plan(k)
        with failing_registry(monkeypatch, root, plan) as reg:
            try:
                reg.publish(name, adapter, owner="acme")
            except RegistryUnavailable as exc:
                assert "injected failure" in str(exc)
            else:
                assert plan.calls < k, "the publish ended without making the failing call"
                break
        fresh = Registry(root)
        assert state(fresh) == before, f"a failure at call {k} changed what is served"
        with pytest.raises(AdapterError):
            fresh.resolve(f"{name}@{adapter.digest}", "acme")
        assert not [p for p in snapshot(root) if "/.tmp-" in p]
        assert fresh.publish(name, adapter, owner="acme").digest == adapter.digest
        assert fresh.resolve(name, "acme").digest == adapter.digest
        assert_consistent(root)
    else:
        pytest.fail("the publish never succeeded")
    assert k > 5  # every write of the publish was made to fail once


def test_backend_errors_are_registry_unavailable(uri, monkeypatch):
    reg = Registry(uri)
    version = reg.publish("a", make_adapter())
    fs, _ = url_to_fs(uri)

    def refuse(*args, **kwargs):
        raise PermissionError("access denied")

    with monkeypatch.context() as m:
        for method in ("cat_file", "ls", "exists", "find", "open", "pipe_file", "makedirs"):
            m.setattr(type(fs), method, refuse)
        for call in (
            lambda: reg.resolve("a"),
            lambda: reg.list(),
            lambda: reg.show("a"),
            lambda: reg.load(version.qualified),
            lambda: reg.publish("b", make_adapter(seed=1)),
            lambda: reg.delete("a"),
            lambda: reg.gc(),
        ):
            with pytest.raises(RegistryUnavailable, match="access denied"):
                call()
    assert reg.resolve("a") == version


def test_corrupted_entries_are_skipped_counted_and_logged(uri, caplog):
    reg = Registry(uri)
    for i, name in enumerate(["bad-json", "bad-meta", "gone", "ok", "wrong-owner"]):
        reg.publish(name, make_adapter(seed=10 + i), owner="acme")
    reg.publish("other", make_adapter(seed=20), owner="globex")
    fs, root = url_to_fs(uri)
    names = f"{root}/tenants/acme/names"
    fs.pipe_file(f"{names}/bad-json/latest.json", b'{"name": "bad-js')
    pointer = json.loads(fs.cat_file(f"{names}/gone/latest.json"))
    fs.pipe_file(f"{names}/gone/latest.json", json.dumps({**pointer, "digest": "0" * 64}).encode())
    meta = f"{root}/versions/{make_adapter(seed=11).digest}/meta.json"
    fs.pipe_file(meta, b"[]")
    pointer = json.loads(fs.cat_file(f"{names}/wrong-owner/latest.json"))
    fs.pipe_file(
        f"{names}/wrong-owner/latest.json", json.dumps({**pointer, "owner": "globex"}).encode()
    )
    with caplog.at_level(logging.WARNING, logger="loraserve.registry"):
        assert [(e.name, e.owner) for e in reg.list()] == [("ok", "acme"), ("other", "globex")]
    assert reg.skipped == 4
    logged = " ".join(r.getMessage() for r in caplog.records if r.name == "loraserve.registry")
    for name in ("bad-json", "bad-meta", "gone", "wrong-owner"):
        assert f"names/{name}" in logged
    assert [e.name for e in reg.list("acme")] == ["ok"] and reg.skipped == 8
    # A corrupted name still answers with its problem, and can be deleted.
    with pytest.raises(AdapterError, match="corrupted"):
        reg.resolve("bad-json", "acme")
    reg.delete("bad-json", "acme")
    assert not reg.exists("bad-json", "acme")
