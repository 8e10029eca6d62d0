"""The adapter registry on file:// and memory://: round trips, names, owners, errors, races."""

from __future__ import annotations

import json
import multiprocessing
import threading
import uuid

import fsspec
import pytest
import torch
from fsspec.core import url_to_fs

from adapters.errors import AdapterError
from adapters.format import parse_adapter
from adapters.registry import Entry, Registry, Version
from tests.adapters.factory import peft_adapter_files

BAD_NAMES = ["Bad", "../x", "a:b", "", "x" * 65, "base", "a/b"]


def make_adapter(seed=0, rank=8, draft_seed=None):
    """A parsed adapter for the tiny base; with draft_seed, a draft companion too."""
    draft = None
    if draft_seed is not None:
        draft = parse_adapter(peft_adapter_files(rank=4, seed=draft_seed), label="draft")
    return parse_adapter(peft_adapter_files(rank=rank, seed=seed), draft=draft)


@pytest.fixture(params=["file", "memory"])
def uri(request, tmp_path):
    """A fresh registry URL: a folder under tmp_path, or a unique memory:// root."""
    if request.param == "file":
        yield f"file://{tmp_path / 'registry'}"
        return
    root = f"memory://registry-test-{uuid.uuid4().hex}"
    yield root
    fs, path = url_to_fs(root)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def snapshot(uri: str) -> dict[str, bytes]:
    """Every file under the registry's root with its bytes."""
    fs, root = url_to_fs(uri)
    return {p[len(root) :]: fs.cat_file(p) for p in fs.find(root)}


def assert_consistent(uri: str) -> None:
    """Every pointer parses and names a complete version that loads; no partial files remain."""
    reg = Registry(uri)
    files = snapshot(uri)
    assert not [p for p in files if "/.tmp-" in p]
    versions = {p.split("/")[2] for p in files if p.startswith("/versions/")}
    assert {v for v in versions if f"/versions/{v}/meta.json" in files} == versions
    for path, data in files.items():
        if path.endswith("/latest.json"):
            pointer = json.loads(data)
            assert pointer["digest"] in versions
            assert f"/names/{pointer['name']}/history/{pointer['digest']}" in files
            assert reg.load(pointer["name"]).digest == pointer["digest"]


def assert_same_adapter(got, want):
    """Same bytes, digest, rank, scale and tensors."""
    assert got.config_bytes == want.config_bytes
    assert got.weights_bytes == want.weights_bytes
    assert (got.digest, got.rank, got.scale) == (want.digest, want.rank, want.scale)
    assert got.modules.keys() == want.modules.keys()
    for key, m in want.modules.items():
        assert torch.equal(got.modules[key].a, m.a) and torch.equal(got.modules[key].b, m.b)


def test_plain_folder_is_a_local_registry(tmp_path):
    reg = Registry(str(tmp_path / "plain"))
    reg.publish("x", make_adapter())
    assert (tmp_path / "plain" / "names" / "x" / "latest.json").is_file()


def test_round_trip(uri):
    reg = Registry(uri)
    adapter = make_adapter()
    version = reg.publish("support-bot", adapter, owner="alice")
    assert isinstance(version, Version)
    assert (version.name, version.digest, version.owner) == ("support-bot", adapter.digest, "alice")
    assert version.ref == f"support-bot@{adapter.digest}"
    assert (version.rank, version.scale, version.num_bytes) == (8, 2.0, adapter.num_bytes)
    assert version.target_modules == adapter.target_modules and not version.has_draft
    assert Registry(uri).resolve("support-bot") == version
    assert_same_adapter(Registry(uri).load("support-bot"), adapter)
    assert_same_adapter(reg.load(version.ref), adapter)


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


def test_owners(uri):
    reg = Registry(uri)
    reg.publish("a", make_adapter(seed=0), owner="alice")
    reg.publish("b", make_adapter(seed=1), owner="bob")
    before = snapshot(uri)
    with pytest.raises(AdapterError, match="belongs to owner 'alice'"):
        reg.publish("a", make_adapter(seed=2), owner="bob")
    with pytest.raises(AdapterError, match="belongs to owner 'alice'"):
        reg.publish("a", make_adapter(seed=0), owner="bob")
    assert snapshot(uri) == before
    taken = reg.publish("a", make_adapter(seed=2), owner="bob", replace_owner=True)
    assert reg.resolve("a") == taken and taken.owner == "bob"
    assert [e.name for e in reg.list(owner="bob")] == ["a", "b"]
    assert reg.list(owner="alice") == []
    with pytest.raises(AdapterError, match="owner"):
        reg.publish("c", make_adapter(), owner="")


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
    assert reg.show("alpha") == Entry(**{**alpha.__dict__, "history": (adapter.digest,)})
    assert reg.exists("alpha") and not reg.exists("beta")


def test_delete(uri):
    reg = Registry(uri)
    version = reg.publish("a", make_adapter())
    loaded = reg.load("a")
    reg.delete("a")
    assert not reg.exists("a") and reg.list() == []
    for ref in ("a", version.ref):
        with pytest.raises(AdapterError, match="unknown adapter 'a'"):
            reg.resolve(ref)
    assert_same_adapter(loaded, make_adapter())
    files = snapshot(uri)
    assert f"/versions/{version.digest}/meta.json" in files
    assert not [p for p in files if p.startswith("/names/a/")]
    with pytest.raises(AdapterError, match="unknown adapter 'a'"):
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
        with pytest.raises(AdapterError, match="unknown adapter 'nope'"):
            call("nope")
    with pytest.raises(AdapterError, match="unknown version"):
        reg.resolve("a@" + "0" * 64)
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
    fs.pipe_file(f"{root}/names/a/history/{pending.digest}", b"")
    with pytest.raises(AdapterError, match="incomplete"):
        reg.resolve(f"a@{pending.digest}")
    assert reg.resolve("a") == first
    pointer = json.dumps({"name": "a", "digest": pending.digest, "owner": "default", "updated": ""})
    fs.pipe_file(f"{root}/names/a/latest.json", pointer.encode())
    with pytest.raises(AdapterError, match="incomplete"):
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


def test_unopenable_registry():
    with pytest.raises(AdapterError, match="cannot open"):
        Registry("nosuchprotocol://x")


def _worker_jobs(i: int) -> list[tuple[str, int]]:
    """(name, seed) pairs: one name for all with different content, one's own, shared content."""
    return [("shared", 100 + i), (f"own-{i}", 200 + i), ("common", 7), ("shared", 300 + i)]


def _publish_jobs(uri: str, i: int, barrier) -> None:
    """Wait for every worker, then publish worker i's jobs. Runs in threads and processes."""
    reg = Registry(uri)
    adapters = [(name, make_adapter(seed=seed)) for name, seed in _worker_jobs(i)]
    barrier.wait()
    for name, adapter in adapters:
        reg.publish(name, adapter)


def _check_after_race(uri: str, workers: int) -> None:
    """The registry is consistent and holds exactly what the workers published."""
    assert_consistent(uri)
    reg = Registry(uri)
    seeds = {seed for i in range(workers) for _, seed in _worker_jobs(i)}
    digest = {seed: make_adapter(seed=seed).digest for seed in seeds}
    names = ["common", "shared", *(f"own-{i}" for i in range(workers))]
    assert [e.name for e in reg.list()] == sorted(names)
    shared = {digest[s] for i in range(workers) for name, s in _worker_jobs(i) if name == "shared"}
    entry = reg.show("shared")
    assert entry.digest in shared and set(entry.history) == shared
    assert reg.show("common").history == (digest[7],)
    fs, root = url_to_fs(uri)
    stored = {p.rstrip("/").rsplit("/", 1)[1] for p in fs.ls(f"{root}/versions", detail=False)}
    assert stored == set(digest.values())


def test_concurrent_threads(uri):
    workers, readers = 8, 2
    barrier = threading.Barrier(workers + readers)
    done = threading.Event()
    errors: list[BaseException] = []

    def guarded(fn, *args):
        try:
            fn(*args)
        except Exception as exc:
            errors.append(exc)

    def read():
        # Readers racing the publishers see a whole version or no name, never half a file.
        reg = Registry(uri)
        barrier.wait()
        while not done.is_set():
            try:
                reg.load("shared")
            except AdapterError as exc:  # until the first publish lands
                assert "unknown adapter 'shared'" in str(exc)
            reg.list()

    threads = [
        threading.Thread(target=guarded, args=(_publish_jobs, uri, i, barrier))
        for i in range(workers)
    ]
    threads += [threading.Thread(target=guarded, args=(read,)) for _ in range(readers)]
    for t in threads:
        t.start()
    for t in threads[:workers]:
        t.join()
    done.set()
    for t in threads[workers:]:
        t.join()
    assert not errors
    _check_after_race(uri, workers)


def test_concurrent_processes(tmp_path):
    uri = f"file://{tmp_path / 'registry'}"
    workers = 4
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers)
    procs = [ctx.Process(target=_publish_jobs, args=(uri, i, barrier)) for i in range(workers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0] * workers
    _check_after_race(uri, workers)


def test_memory_roots_are_cleaned_up():
    fs = fsspec.filesystem("memory")
    assert not [p for p in fs.store if p.startswith("/registry-test-")]
    assert not [p for p in fs.pseudo_dirs if p.startswith("/registry-test-")]
