"""Bad arguments to the LoRA ops raise ValueError naming the argument and what was expected."""

import pytest
import torch

from kernels import build_segments, lora_expand, lora_shrink

T, H, S, R, W = 6, 32, 3, 8, 40


@pytest.fixture
def parts():
    seg = build_segments(torch.tensor([0, 1, -1, 2, 0, 1]), torch.tensor([8, 4, 8]))
    return {
        "x": torch.randn(T, H),
        "a": torch.randn(S, R, H),
        "out": torch.zeros(T, R),
        "t": torch.zeros(T, R),
        "b": torch.randn(S, R, W),
        "y": torch.zeros(T, W),
        "scales": torch.ones(S),
        "seg": seg,
    }


def shrink(p, **kw):
    args = {"x": p["x"], "lora_a": p["a"], "out": p["out"], "segments": p["seg"]} | kw
    return lora_shrink(**args)


def expand(p, **kw):
    args = {
        "t": p["t"],
        "lora_b": p["b"],
        "y": p["y"],
        "segments": p["seg"],
        "scales": p["scales"],
    } | kw
    return lora_expand(**args)


SHRINK_CASES = [
    ("x", lambda p: {"x": p["x"][None]}, r"x: expected 2 dimensions"),
    ("x dtype", lambda p: {"x": p["x"].double()}, r"x: expected dtype in"),
    ("x list", lambda p: {"x": [[1.0]]}, r"x: expected a torch.Tensor"),
    ("a dtype", lambda p: {"lora_a": p["a"].half()}, r"lora_a: expected dtype in \(float32\)"),
    (
        "a hidden",
        lambda p: {"lora_a": torch.randn(S, R, H + 1)},
        r"lora_a: expected hidden size 32",
    ),
    ("a dims", lambda p: {"lora_a": torch.randn(R, H)}, r"lora_a: expected 3 dimensions"),
    (
        "a strided",
        lambda p: {"lora_a": torch.randn(S, H, R).transpose(1, 2)},
        r"lora_a: expected dense rows \(strides \(\*, 32, 1\)\)",
    ),
    (
        "a slots between rows",  # slots 12 elements apart: not a whole number of rows of 32
        lambda p: {"lora_a": torch.randn(S * R * H).as_strided((S, R, H), (12, H, 1))},
        r"lora_a: expected slots a whole number of rows apart",
    ),
    (
        "a slices paged unlike",  # slot stride 2 rows in slice 1, 8 (contiguous) in slice 0
        lambda p: {
            "lora_a": [
                p["a"],
                torch.randn((S - 1) * 2 * H + R * H).as_strided((S, R, H), (2 * H, H, 1)),
            ],
            "out": torch.zeros(2, T, R),
        },
        r"lora_a\[1\]: expected slots .*, 8 like slice 0\)",
    ),
    (
        "a slices",
        lambda p: {"lora_a": [p["a"], torch.randn(S, R + 1, H)], "out": torch.zeros(2, T, R)},
        r"lora_a\[1\]: expected \[num_slots, max_rank\]",
    ),
    ("a empty", lambda p: {"lora_a": []}, r"lora_a: expected a tensor or a non-empty sequence"),
    ("out shape", lambda p: {"out": torch.zeros(T, R + 1)}, r"out: expected shape \(6, 8\)"),
    (
        "out dtype",
        lambda p: {"out": torch.zeros(T, R, dtype=torch.float16)},
        r"out: expected dtype float32",
    ),
    (
        "out slices",
        lambda p: {"lora_a": [p["a"], p["a"]], "out": torch.zeros(T, R)},
        r"out: expected 3 dimensions",
    ),
    (
        "segments tokens",
        lambda p: {"segments": build_segments(torch.tensor([0]), torch.tensor([8, 8, 8]))},
        r"segments: built for 1 tokens",
    ),
    (
        "segments slots",
        lambda p: {"segments": build_segments(torch.zeros(T, dtype=torch.long), torch.tensor([8]))},
        r"segments: built for 1 slots",
    ),
    (
        "segments rank",
        lambda p: {
            "segments": build_segments(torch.zeros(T, dtype=torch.long), torch.tensor([9, 8, 8]))
        },
        r"segments: a slot has rank 9, above the stack's max_rank 8",
    ),
    ("segments type", lambda p: {"segments": None}, r"segments: expected Segments"),
]


@pytest.mark.parametrize(
    ("kw", "message"), [c[1:] for c in SHRINK_CASES], ids=[c[0] for c in SHRINK_CASES]
)
def test_shrink_rejects(parts, kw, message):
    with pytest.raises(ValueError, match=message):
        shrink(parts, **kw(parts))


EXPAND_CASES = [
    ("y dims", lambda p: {"y": p["y"][None]}, r"y: expected 2 dimensions"),
    ("y width", lambda p: {"y": torch.zeros(T, W + 1)}, r"y: expected 40 columns"),
    ("b dtype", lambda p: {"lora_b": p["b"].bfloat16()}, r"lora_b: expected dtype in \(float32\)"),
    ("t shape", lambda p: {"t": torch.zeros(T, R - 1)}, r"t: expected shape \(6, 8\)"),
    (
        "t dtype",
        lambda p: {"t": torch.zeros(T, R, dtype=torch.float16)},
        r"t: expected dtype float32 or torch.float32",
    ),
    ("scales shape", lambda p: {"scales": torch.ones(S + 1)}, r"scales: expected shape \(3,\)"),
    (
        "scales dtype",
        lambda p: {"scales": torch.ones(S, dtype=torch.long)},
        r"scales: expected dtype in",
    ),
    (
        "slices",
        lambda p: {"lora_b": [p["b"], p["b"]], "y": torch.zeros(T, 2 * W), "t": torch.zeros(T, R)},
        r"t: expected 3 dimensions",
    ),
]


@pytest.mark.parametrize(
    ("kw", "message"), [c[1:] for c in EXPAND_CASES], ids=[c[0] for c in EXPAND_CASES]
)
def test_expand_rejects(parts, kw, message):
    with pytest.raises(ValueError, match=message):
        expand(parts, **kw(parts))


def test_meta_device_is_named(parts):
    with pytest.raises(ValueError, match=r"lora_a: expected a tensor on cpu, got meta"):
        shrink(parts, lora_a=torch.empty(S, R, H, device="meta"))


def test_valid_call_passes(parts):
    expand(parts, t=shrink(parts))
    assert parts["y"].abs().sum() > 0
