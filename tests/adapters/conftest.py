"""Fixtures of the adapter tests."""

import uuid
from contextlib import ExitStack, closing

import pytest
from fsspec.core import url_to_fs

from adapters.slab.slab import AdapterSlab
from tests.adapters.factory import TINY_SPEC


@pytest.fixture
def make_slab():
    """Build slabs over TINY_SPEC with small defaults; each is closed after the test."""
    defaults = {"num_slots": 3, "max_rank": 16, "max_cpu_loras": 4}
    with ExitStack() as stack:
        yield lambda reg, **kw: stack.enter_context(
            closing(AdapterSlab(TINY_SPEC, loader=reg, **{**defaults, **kw}))
        )


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
