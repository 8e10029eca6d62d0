"""Hostile adapter files: each is refused with AdapterError, never an unhandled exception."""

import json
import struct

import pytest

from adapters.errors import AdapterError
from adapters.format.adapter import parse_adapter
from tests.adapters.factory import TINY_SPEC, peft_adapter_files, peft_config, peft_tensors

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


def _header(files):
    data = files[WEIGHTS]
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _with_header(edit, files=None):
    """The tiny adapter with its safetensors header rewritten by edit(header) (data kept)."""
    files = files or peft_adapter_files()
    header, body = _header(files)
    blob = edit(header) if callable(edit) else edit
    blob = blob if isinstance(blob, bytes) else json.dumps(blob).encode()
    return {**files, WEIGHTS: struct.pack("<Q", len(blob)) + blob + body}


def _entry(**changes):
    def edit(header):
        header[Q_A].update(changes)
        return header

    return _with_header(edit)


def _renamed(old, new):
    files = peft_adapter_files()
    return _with_header(lambda h: {k.replace(old, new): v for k, v in h.items()}, files)


def _config(text: str | bytes):
    return {**peft_adapter_files(), CONFIG: text if isinstance(text, bytes) else text.encode()}


def _deep(depth):
    return "[" * depth + "]" * depth


HOSTILE = [
    ("config nested 50,000 deep", lambda: _config(_deep(50_000)), "nests deeper than 16"),
    (
        "config value nested 40 deep",
        lambda: _config(json.dumps(peft_config())[:-1] + f', "x": {_deep(40)}}}'),
        "nests deeper than 16",
    ),
    ("config of 2 MiB", lambda: _config(" " * 2**21 + "{}"), "over the limit of 1048576"),
    ("config NaN", lambda: _config('{"r": 8, "lora_alpha": NaN}'), "NaN is not JSON"),
    ("config 5,000-digit r", lambda: _config('{"r": 1' + "0" * 5000 + "}"), "not valid JSON"),
    ("config not utf-8", lambda: _config(b'{"r": "\xff"}'), "not valid JSON"),
    ("header nested 50,000 deep", lambda: _with_header(_deep(50_000).encode()), "nests deeper"),
    (
        "header metadata nested 40 deep",
        lambda: _with_header(lambda h: {**h, "__metadata__": json.loads(_deep(40))}),
        "nests deeper",
    ),
    ("header length 2**64-1", lambda: {**peft_adapter_files(), WEIGHTS: b"\xff" * 8}, "claims"),
    ("header not utf-8", lambda: _with_header(b'{"\xff": 1}'), "not valid JSON"),
    (
        "layer of 5,000 digits",
        lambda: _renamed("layers.0.", f"layers.{'9' * 5000}."),
        "layer index",
    ),
    (
        "layer of 4,000 digits",
        lambda: _renamed("layers.0.", f"layers.{'9' * 4000}."),
        "layer index",
    ),
    ("layer in other digits", lambda: _renamed("layers.1.", "layers.\u0661."), "matches no LoRA"),
    ("shape of booleans", lambda: _entry(shape=[True, True]), "lies about its offsets or shape"),
    ("shape product overflows", lambda: _entry(shape=[2**62, 2**62, 0]), "lies about"),
    ("shape beyond int64", lambda: _entry(shape=[2**70, 0]), "lies about"),
    ("shape of 9 dims", lambda: _entry(shape=[1] * 9), "lies about"),
    ("dtype a list", lambda: _entry(dtype=["F32"]), "unknown dtype"),
    ("dtype an object", lambda: _entry(dtype={"F32": 1}), "unknown dtype"),
    ("offsets booleans", lambda: _entry(data_offsets=[False, True]), "lies about"),
    ("entry not an object", lambda: _with_header(lambda h: {**h, Q_A: [1, 2]}), "malformed"),
]


@pytest.mark.parametrize(
    ("files", "message"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
@pytest.mark.parametrize("base", [TINY_SPEC, None], ids=["base", "no-base"])
def test_hostile_files_are_adapter_errors(files, message, base):
    with pytest.raises(AdapterError, match=message) as info:
        parse_adapter(files(), base=base)
    assert len(str(info.value)) < 400  # the message stays a line however big the input


def test_every_truncation_of_a_valid_file_is_refused():
    files = peft_adapter_files(modules=("q_proj",))
    data = files[WEIGHTS]
    for cut in range(0, len(data), 7):
        with pytest.raises(AdapterError):
            parse_adapter({**files, WEIGHTS: data[:cut]}, base=TINY_SPEC)


def test_a_megabyte_tensor_name_gives_a_short_message():
    name = "x" * 2**20
    files = {CONFIG: json.dumps(peft_config()).encode()}
    files[WEIGHTS] = _with_header(lambda h: {name: h[Q_A]}, peft_adapter_files())[WEIGHTS]
    with pytest.raises(AdapterError, match="matches no LoRA module") as info:
        parse_adapter(files)
    assert len(str(info.value)) < 400


def test_shallow_headers_and_configs_still_load():
    files = _with_header(lambda h: {**h, "__metadata__": {"format": "pt"}})
    adapter = parse_adapter(files, base=TINY_SPEC)
    assert adapter.rank == 8 and set(peft_tensors()) == set(_header(files)[0]) - {"__metadata__"}
