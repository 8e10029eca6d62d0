"""Workers AI's finetunes against the limits: unfinished ones and their files count against a
tenant's max_adapters and max_adapter_mb, and one left alone is dropped."""

import pytest
import torch
from safetensors.torch import save

from serving.api.workers_ai import finetune_staging
from tests.serving.api.served import serve
from tests.serving.api.workers_ai.test_finetunes import (
    CONFIG,
    WEIGHTS,
    asset,
    create,
    error_of,
    files_of,
    listed,
)


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("finetune-expiry")) as s:
        yield s


def test_unfinished_finetunes_left_alone_are_dropped(served, monkeypatch):
    made = create(served, "ft-abandoned").json()["result"]
    asset(served, made["id"], CONFIG, files_of(served, "upper")[CONFIG])
    monkeypatch.setattr(finetune_staging, "UNFINISHED_TTL_S", -1.0)
    assert made["id"] not in listed(served)
    assert served.registry.staged.get(made["id"]) is None
    assert served.registry.staged.files(made["id"]) == {}
    r = asset(served, made["id"], WEIGHTS, files_of(served, "upper")[WEIGHTS])
    assert r.status_code == 404


@pytest.fixture(scope="module")
def limited(world, tmp_path_factory):
    # max_adapter_mb fractional (as the config never is) so that this tiny world's files pass it
    one_adapter = {"acme": {"max_adapters": 1, "max_adapter_mb": 0.01}}
    root = tmp_path_factory.mktemp("finetune-limits")
    with serve(world, root, publish=(), limits_of=lambda t: one_adapter.get(t, {})) as s:
        yield s


def test_unfinished_finetunes_and_their_files_count_against_the_limits(limited):
    assert create(limited, "ft-one").status_code == 200
    r = create(limited, "ft-two")
    assert r.status_code == 429 and "missing files" in error_of(r)
    assert create(limited, "ft-one").status_code == 200  # replacing one is no new one
    [finetune_id] = listed(limited)
    r = asset(limited, finetune_id, WEIGHTS, _big_safetensors(16 * 2**10))
    assert r.status_code == 429 and "above its limit of 0.01 MB" in error_of(r)
    assert listed(limited)[finetune_id]["ready"] is False


def _big_safetensors(num_bytes: int) -> bytes:
    return save({"x": torch.zeros(num_bytes // 4, dtype=torch.float32)})
