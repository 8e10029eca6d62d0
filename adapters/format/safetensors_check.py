"""Checks a safetensors file's header against its size before anything is allocated.

A file is 8 bytes (little-endian u64 header length N), N bytes of JSON header,
then the tensor data. A header that lies (offsets past the end, sizes that do
not match shape x dtype, overlapping tensors) is refused here, so a hostile
upload cannot make the loader allocate what the file does not hold. The header's JSON is
bounded in size and depth, and dimensions in range, so no header can raise anything but
AdapterError.
"""

from __future__ import annotations

import itertools
import math
import struct

from adapters.errors import AdapterError, quoted
from adapters.format.bounded_json import parse_json

ITEM_SIZE = {
    "F16": 2,
    "BF16": 2,
    "F32": 4,
    "F64": 8,
    "I8": 1,
    "U8": 1,
    "I16": 2,
    "I32": 4,
    "I64": 8,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
}
SUPPORTED = {"F16", "BF16", "F32"}
MAX_HEADER_BYTES = 16 * 2**20
MAX_NDIM = 8
# torch multiplies a shape's dimensions in int64, zeros or not ([2**62, 2**62, 0] overflows)
MAX_ELEMENTS = 2**40


def check_header(data: bytes, label: str) -> dict[str, dict]:
    """The header's tensor entries {name: {dtype, shape, data_offsets}}, all verified."""
    if len(data) < 8:
        raise AdapterError(
            f"{label}: not a safetensors file (shorter than its 8-byte header length)"
        )
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_BYTES or 8 + n > len(data):
        raise AdapterError(
            f"{label}: safetensors header claims {n} bytes, the file has {len(data) - 8}"
        )
    header = parse_json(data[8 : 8 + n], f"{label}: safetensors header", max_bytes=MAX_HEADER_BYTES)
    if not isinstance(header, dict):
        raise AdapterError(f"{label}: safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    body = len(data) - 8 - n
    spans = []
    for name, entry in header.items():
        _check_entry(label, name, entry, body)
        spans.append((*entry["data_offsets"], name))
    spans.sort()
    for (_, end, a), (begin, _, b) in itertools.pairwise(spans):
        if begin < end:
            raise AdapterError(
                f"{label}: tensors {quoted(a)} and {quoted(b)} overlap in the safetensors data"
            )
    return header


def _check_entry(label: str, name: str, entry: object, body: int) -> None:
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise AdapterError(f"{label}: tensor {quoted(name)} has a malformed header entry")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in ITEM_SIZE:
        raise AdapterError(f"{label}: tensor {quoted(name)} has unknown dtype {quoted(dtype)}")
    if dtype not in SUPPORTED:
        raise AdapterError(
            f"{label}: tensor {quoted(name)} has unsupported dtype {dtype}; use float16, bfloat16 or float32"
        )
    ok_shape = (
        isinstance(shape, list)
        and len(shape) <= MAX_NDIM
        and all(_is_count(d) for d in shape)
        and math.prod(max(d, 1) for d in shape) <= MAX_ELEMENTS
    )
    ok_offsets = (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(_is_count(o) for o in offsets)
        and offsets[0] <= offsets[1] <= body
    )
    if not ok_shape or not ok_offsets:
        raise AdapterError(
            f"{label}: tensor {quoted(name)} has a header that lies about its offsets or shape "
            f"(offsets {quoted(offsets, 60)}, shape {quoted(shape, 60)}, "
            f"data section of {body} bytes)"
        )
    if (offsets[1] - offsets[0]) != math.prod(shape) * ITEM_SIZE[dtype]:
        raise AdapterError(
            f"{label}: tensor {quoted(name)} header says shape {shape} {dtype} but spans "
            f"{offsets[1] - offsets[0]} bytes"
        )


def _is_count(value: object) -> bool:
    """A non-negative JSON integer (true and false are ints to Python, not to a header)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
