"""The LoRA kernels' tuned launch tables: buckets, the file format, and the files shipped."""

import json

import pytest
import torch

from kernels import lora_tuning
from kernels.lora_tuning import ExpandConfig, ShrinkConfig, bucket, file_for, rows_per_program


@pytest.fixture
def table_file(tmp_path, monkeypatch):
    path = tmp_path / "tuned.json"
    monkeypatch.setenv("LORASERVE_LORA_CONFIGS", str(path))
    lora_tuning.clear_cache()
    yield path
    lora_tuning.clear_cache()


def test_buckets_split_decode_batches_from_prefill():
    assert [bucket(n) for n in (1, 16, 17, 64, 65, 256, 257, 4096)] == [
        "16", "16", "64", "64", "256", "256", "large", "large",
    ]  # fmt: skip


def test_rows_per_program_follow_the_longest_segment_up_to_the_cap():
    assert [rows_per_program(n, 64) for n in (1, 16, 17, 32, 33, 4096)] == [16, 16, 32, 32, 64, 64]
    assert [rows_per_program(n, 16) for n in (1, 32, 4096)] == [16, 16, 16]


def test_a_file_is_named_for_its_gpu():
    assert file_for("NVIDIA H200").name == "NVIDIA_H200.json"
    assert file_for("NVIDIA H100 80GB HBM3").name == "NVIDIA_H100_80GB_HBM3.json"


def test_a_table_gives_its_buckets_and_leaves_the_rest_to_the_defaults(table_file):
    table_file.write_text(json.dumps({
        "shrink": {"64": {"block_k": 256, "num_warps": 2, "num_stages": 4, "programs_per_sm": 8,
                          "block_m": 16}},
        "expand": {"16": {"block_n": 64, "num_warps": 8, "num_stages": 2}},
        "measured": {"note": "kept beside the configs, not read"},
    }))  # fmt: skip
    table = lora_tuning._table(0)
    assert table["shrink"] == {"64": ShrinkConfig(256, 2, 4, 8, block_m=16)}
    assert table["expand"] == {"16": ExpandConfig(64, 8, 2)}
    # Off CUDA (the interpreter) the launchers always get the defaults.
    assert lora_tuning.shrink_config(torch.device("cpu"), 32) == ShrinkConfig()


@pytest.mark.parametrize(
    "entry, problem",
    [
        ({"shrink": {"64": {"block_k": 96}}}, "block_k=96"),
        ({"shrink": {"64": {"block_k": 8}}}, "block_k=8"),
        ({"expand": {"16": {"num_warps": 3}}}, "num_warps=3"),
        ({"expand": {"16": {"block_q": 32}}}, "block_q"),
        ({"expand": {"16": {"block_m": 8}}}, "block_m=8"),
        ({"expand": {"32": {"block_n": 32}}}, "unknown bucket"),
        ({"expand": {"16": {"n_chunks": 1.5}}}, "not whole numbers: n_chunks=1.5"),
        ({"shrink": {"16": {"num_warps": True}}}, "num_warps=True"),
        ({"expand": {"16": 5}}, "expected an object of fields"),
        ({"expnad": {"16": {}}}, "'expnad': expected shrink, expand or measured"),
        ([1], "expected an object of ops"),
    ],
)
def test_a_bad_table_names_its_problem(table_file, entry, problem):
    table_file.write_text(json.dumps(entry))
    with pytest.raises(ValueError, match=problem) as info:
        lora_tuning._table(0)
    assert str(table_file) in str(info.value)


def test_a_named_file_that_is_missing_is_an_error(table_file):
    with pytest.raises(ValueError, match=r"LORASERVE_LORA_CONFIGS: .* is not a file"):
        lora_tuning._table(0)


@pytest.mark.parametrize("path", sorted(lora_tuning.TUNED_DIR.glob("*.json")), ids=lambda p: p.name)
def test_the_shipped_tables_load(table_file, path):
    table_file.write_text(path.read_text())
    table = lora_tuning._table(0)
    assert set(table) <= {"shrink", "expand"} and table
