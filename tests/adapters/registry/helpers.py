"""Shared pieces of the registry tests: adapters, snapshots and consistency checks."""

from __future__ import annotations

import json

import torch
from fsspec.core import url_to_fs

from adapters.format.adapter import parse_adapter
from adapters.registry.registry import Registry
from tests.adapters.factory import peft_adapter_files


def make_adapter(seed=0, rank=8, draft_seed=None):
    """A parsed adapter for the tiny base; with draft_seed, a draft companion too."""
    draft = None
    if draft_seed is not None:
        draft = parse_adapter(peft_adapter_files(rank=4, seed=draft_seed), label="draft")
    return parse_adapter(peft_adapter_files(rank=rank, seed=seed), draft=draft)


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
            folder = path.removesuffix("/latest.json")
            assert pointer["digest"] in versions
            assert f"{folder}/history/{pointer['digest']}" in files
            version = reg.resolve(pointer["name"], pointer["owner"])
            assert reg.load(version.qualified).digest == pointer["digest"]


def state(reg: Registry) -> tuple[list, dict]:
    """What a registry serves: its listing, and each listed name's latest version's bytes."""
    entries = reg.list()
    loaded = {}
    for e in entries:
        adapter = reg.load(reg.resolve(e.name, e.owner).qualified)
        loaded[(e.owner, e.name)] = (adapter.digest, adapter.weights_bytes)
    return entries, loaded


def assert_same_adapter(got, want):
    """Same bytes, digest, rank, scale and tensors."""
    assert got.config_bytes == want.config_bytes
    assert got.weights_bytes == want.weights_bytes
    assert (got.digest, got.rank, got.scale) == (want.digest, want.rank, want.scale)
    assert got.modules.keys() == want.modules.keys()
    for key, m in want.modules.items():
        assert torch.equal(got.modules[key].a, m.a) and torch.equal(got.modules[key].b, m.b)
