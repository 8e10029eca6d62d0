"""On a local disk a publish is durable before it is reachable: every file of the version is
fsynced, and the folder it was renamed into fsynced, before latest.json moves."""

import os

from adapters.registry import store as store_module
from adapters.registry.registry import Registry
from tests.adapters.registry.helpers import make_adapter


def test_files_and_folders_are_fsynced_before_the_pointer_moves(tmp_path, monkeypatch):
    events = []  # ("fsync", path) and ("mv", destination), in order
    real_fsync = os.fsync

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(store_module.os, "fsync", fsync)
    reg = Registry(f"file://{tmp_path}")
    real_mv = reg._store.fs.mv

    def mv(src, dst, **kwargs):
        events.append(("mv", str(dst)))
        return real_mv(src, dst, **kwargs)

    monkeypatch.setattr(reg._store.fs, "mv", mv)
    adapter = make_adapter(seed=3)
    reg.publish("durable", adapter, "acme")

    pointer = next(i for i, (kind, path) in enumerate(events)
                   if kind == "mv" and path.endswith("/latest.json"))  # fmt: skip
    before = {path for kind, path in events[:pointer] if kind == "fsync"}
    version = tmp_path / "versions" / adapter.digest
    for name in ("adapter_config.json", "adapter_model.safetensors", "meta.json"):
        # the file was fsynced under its temporary name, then its folder after the rename
        assert any(p.startswith(str(version) + "/") and p.endswith(name) for p in before), name
    assert str(version) in before
    assert str(tmp_path / "tenants/acme/names/durable/history") in before
    # and the pointer's own folder once it moved
    after = {path for kind, path in events[pointer:] if kind == "fsync"}
    assert str(tmp_path / "tenants/acme/names/durable") in after
