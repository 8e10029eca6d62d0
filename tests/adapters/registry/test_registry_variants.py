"""The LoRA variants a version uses (Adapter.variants) are recorded in its meta.json and read
back on Version and Entry; meta written before they were recorded reads as none."""

from __future__ import annotations

import json

import pytest
from fsspec.core import url_to_fs

from adapters.format.adapter import load_adapter
from adapters.registry.registry import Registry
from tests.adapters.peft_models import save_peft_adapter
from tests.adapters.registry.helpers import make_adapter

MODULES = ("q_proj", "v_proj")
SAVED = {  # name: save_peft_adapter keywords, the variants PEFT's config makes of them
    "dora": ({"use_dora": True}, ("use_dora",)),
    "mixed": (
        {"lora_bias": True, "rslora": True, "rank_pattern": {"q_proj": 2}},
        ("lora_bias", "rank_pattern", "use_rslora"),
    ),
    "alphas": ({"alpha_pattern": {"v_proj": 3}}, ("alpha_pattern",)),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> the adapter PEFT saved with SAVED[name]'s keywords, parsed."""
    root = tmp_path_factory.mktemp("variants")
    return {
        name: load_adapter(save_peft_adapter(root / name, rank=4, modules=MODULES, **kw)[0])
        for name, (kw, _) in SAVED.items()
    }


@pytest.mark.parametrize("name", SAVED)
def test_published_variants_read_back_everywhere(uri, saved, name):
    reg, want = Registry(uri), SAVED[name][1]
    assert saved[name].variants == want  # what the parser found, recorded as is
    assert reg.publish(name, saved[name], "acme").variants == want
    assert reg.resolve(name, "acme").variants == want
    assert Registry(uri).show(name, "acme").variants == want  # from the files, not memory
    assert [e.variants for e in reg.list("acme")] == [want]
    reg.set_public(name, "acme", True)
    assert [e.variants for e in reg.list_visible("globex")] == [want]


def test_a_plain_adapter_has_none(uri):
    reg = Registry(uri)
    assert reg.publish("plain", make_adapter(seed=1)).variants == ()
    assert reg.show("plain").variants == () and reg.list()[0].variants == ()


def test_meta_written_before_variants_reads_as_none(uri, saved):
    reg = Registry(uri)
    reg.publish("dora", saved["dora"], "acme")
    fs, root = url_to_fs(uri)
    path = f"{root}/versions/{saved['dora'].digest}/meta.json"
    old = {k: v for k, v in json.loads(fs.cat_file(path)).items() if k != "variants"}
    fs.pipe_file(path, json.dumps(old).encode())
    assert reg.resolve("dora", "acme").variants == ()
    assert reg.show("dora", "acme").variants == () and reg.list()[0].variants == ()
    # The version itself is unchanged: loading it still finds the DoRA it serves.
    assert reg.load(reg.resolve("dora", "acme").qualified).variants == ("use_dora",)
    assert reg.skipped == 0
