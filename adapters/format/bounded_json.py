"""JSON from untrusted bytes, with its size and nesting bounded; anything else is an AdapterError.

json.loads recurses once per nesting level and raises RecursionError, not ValueError, on
input nested a few thousand deep, so such a file would escape as an unhandled exception.
Bounding the size first and the depth after parsing keeps every later walk over the value
cheap and shallow.
"""

from __future__ import annotations

import json

from adapters.errors import AdapterError

MAX_DEPTH = 16  # a PEFT config or safetensors header nests 3 deep; anything far deeper is hostile


def parse_json(data: bytes, what: str, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> object:
    """`data` parsed as strict JSON (no NaN/Infinity), refused when over max_bytes or max_depth."""
    if len(data) > max_bytes:
        raise AdapterError(f"{what} is {len(data)} bytes, over the limit of {max_bytes} bytes")
    try:
        value = json.loads(data, parse_constant=_refuse_constant)
    except RecursionError:
        raise AdapterError(f"{what} nests deeper than {max_depth} levels") from None
    except ValueError as exc:  # UnicodeDecodeError and over-long integers included
        raise AdapterError(f"{what} is not valid JSON ({_first_line(exc)})") from None
    if _depth(value) > max_depth:
        raise AdapterError(f"{what} nests deeper than {max_depth} levels")
    return value


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _depth(value: object) -> int:
    """Nesting depth of lists and objects (a scalar is 0, [] is 1), walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
