"""Fuzz of adapter upload: random and mutated safetensors files and configs, published through
a registry. Each upload either raises AdapterError and leaves the registry byte-for-byte as it
was, or stores a version that loads back and validates whole. Anything else, an unhandled
exception above all, fails the test.

The work per example is bounded by the parser's own limits (config and header sizes, JSON
depth, dimensions), not by a timing assertion; hypothesis' deadline only catches a runaway.
"""

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.errors import AdapterError
from adapters.format.adapter import parse_adapter
from adapters.registry.registry import Registry
from tests.adapters.factory import TINY_SPEC, peft_adapter_files
from tests.adapters.registry.helpers import snapshot

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
VALID = peft_adapter_files(rank=2, modules=("q_proj", "down_proj"))
HEADER_LEN = struct.unpack("<Q", VALID[WEIGHTS][:8])[0]
HEADER = json.loads(VALID[WEIGHTS][8 : 8 + HEADER_LEN])
DATA = VALID[WEIGHTS][8 + HEADER_LEN :]
CONFIG_JSON = json.loads(VALID[CONFIG])
FUZZ = settings(
    max_examples=120,
    deadline=10_000,  # ms; a parse takes milliseconds, so only a runaway reaches this
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# Every JSON shape the parser may meet: huge and negative integers, non-finite floats (which
# json.dumps writes as NaN / Infinity), booleans where numbers belong, deep small nests.
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([0, -1, 2**31, 2**63, 2**64 + 1, 10**4000])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["F16", "BF16", "F32", "F64", "I8", "LORA", "none"])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _safetensors(header: dict | bytes, data: bytes = DATA, length: int | None = None) -> bytes:
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(blob) if length is None else length) + blob + data


@st.composite
def mutated_header(draw) -> dict:
    """HEADER with a few edits: a field set to any JSON value, an entry dropped or renamed."""
    header = json.loads(json.dumps(HEADER))
    names = sorted(k for k in header if k != "__metadata__")
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(names))
        if not isinstance(header.get(name), dict):  # dropped, renamed or replaced already
            continue
        edit = draw(st.sampled_from(["field", "drop", "rename", "entry", "metadata"]))
        if edit == "field":
            field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "extra"]))
            header[name][field] = draw(JSON)
        elif edit == "drop":
            del header[name]
        elif edit == "rename":
            digits = draw(st.sampled_from(["1", "00", "9" * 7, "9" * 5000, "\u0661", ""]))
            which = draw(st.sampled_from(["lora_", "lora_C", ""]))
            new = name.replace("layers.0.", f"layers.{digits}.").replace("lora_", which)
            header[new] = header.pop(name)
        elif edit == "entry":
            header[name] = draw(JSON)
        else:
            header["__metadata__"] = draw(JSON)
    return header


def _nested(depth: int, inner: str = "0") -> bytes:
    return ("[" * depth + inner + "]" * depth).encode()


@st.composite
def weights_files(draw) -> bytes:
    kind = draw(st.sampled_from(["valid", "header", "bytes", "length", "cut", "deep", "random"]))
    if kind == "valid":
        return VALID[WEIGHTS]
    if kind == "header":
        return _safetensors(draw(mutated_header()))
    if kind == "bytes":  # a few bytes overwritten anywhere: length, header or tensor data
        data = bytearray(VALID[WEIGHTS])
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    if kind == "length":
        return _safetensors(HEADER, length=draw(st.integers(0, 2**64 - 1)))
    if kind == "cut":
        data = VALID[WEIGHTS]
        return data[: draw(st.integers(0, len(data) - 1))]
    if kind == "deep":
        return _safetensors(_nested(draw(st.integers(1, 60_000))))
    return draw(st.binary(max_size=256))


@st.composite
def config_files(draw) -> bytes:
    # The config is checked first: it stays valid half the time, so the weights get fuzzed.
    kind = draw(st.sampled_from(["valid"] * 5 + ["field", "drop", "bytes", "deep", "random"]))
    config = dict(CONFIG_JSON)
    if kind == "field":
        keys = [*CONFIG_JSON, "rank_pattern", "use_rslora", "x"]
        for _ in range(draw(st.integers(1, 3))):
            config[draw(st.sampled_from(keys))] = draw(JSON)
    elif kind == "drop":
        config.pop(draw(st.sampled_from(sorted(config))))
    elif kind == "bytes":
        data = bytearray(VALID[CONFIG])
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    elif kind == "deep":
        return _nested(draw(st.integers(1, 60_000)), json.dumps(config))
    elif kind == "random":
        return draw(st.binary(max_size=128))
    return json.dumps(config).encode()


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    return Registry(f"file://{tmp_path_factory.mktemp('fuzz')}/registry")


def _upload(registry: Registry, files: dict[str, bytes]) -> None:
    """The upload path of the API and CLI: validate against the base, then publish."""
    before = snapshot(registry.uri)
    try:
        adapter = parse_adapter(files, base=TINY_SPEC)
        version = registry.publish("fuzz", adapter, owner="tenant")
    except AdapterError:
        assert snapshot(registry.uri) == before, "a refused upload changed the registry"
        return
    for verify in (True, False):
        again = registry.load(version.ref, base=TINY_SPEC, verify=verify)
        assert again.digest == adapter.digest and again.modules.keys() == adapter.modules.keys()


@FUZZ
@given(config=config_files(), weights=weights_files())
def test_fuzzed_uploads_are_refused_cleanly_or_stored_whole(registry, config, weights):
    _upload(registry, {CONFIG: config, WEIGHTS: weights})


def test_the_unmutated_adapter_is_accepted(registry):
    _upload(registry, VALID)
    assert registry.resolve("fuzz", "tenant").rank == 2
