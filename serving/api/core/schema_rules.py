"""Which JSON schemas the engine enforces whole: the checks behind a response_format's 400s.

A schema is refused unless it is a valid JSON schema (jsonschema's metaschema check), small
and shallow enough to check and compile at once, and made only of keywords the engine's
grammar compiler was seen to enforce, each where it enforces it (the table in
serving.engine.grammar.enforced). Every refusal names the keyword and where it is, as a
JSON pointer into the schema.
"""

from __future__ import annotations

import functools
import json
import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from serving.api.core.schema_patterns import pattern_problem
from serving.api.core.text import nesting, unicode
from serving.engine.grammar.cost import cost_problem
from serving.engine.grammar.cost import pointer as _where
from serving.engine.grammar.enforced import (
    ALONE,
    ANNOTATIONS,
    DECIMALS,
    EXACT_FORMATS,
    FORMATS,
    KEYWORDS,
    LENGTHS,
    MAX_MULTIPLE_OF,
    NUMBER_ONLY,
    STRING_ONLY,
    VALUES,
    WHY,
)
from serving.engine.grammar.formats import COUNTS, SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_ONE, prepared

MAX_SCHEMA_BYTES = 32 * 1024  # as compact JSON; checking is CPU time spent before admission
MAX_SCHEMA_DEPTH = 32  # nested objects and arrays
CHECKED_SCHEMAS = 256  # schema checks remembered: clients resend one schema with every request

NOT_ENFORCED = "not enforced by the grammar compiler"
DEFINITIONS = frozenset({"$defs", "definitions"})


def check_schema(schema: object, strict: bool = False) -> dict:
    """schema if it is a JSON schema the engine enforces whole, strict or not (which changes
    its compile cost); ValueError naming why not."""
    if not isinstance(schema, dict):
        raise ValueError(f"the schema must be a JSON object, got {_kind(schema)}")
    depth = nesting(schema, MAX_SCHEMA_DEPTH)
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(f"the schema nests {depth} levels deep, more than the "
                         f"{MAX_SCHEMA_DEPTH} allowed")  # fmt: skip
    text = canonical(schema)
    unicode(json.dumps(schema, ensure_ascii=False))  # canonical() would escape a surrogate
    size = len(text.encode())
    if size > MAX_SCHEMA_BYTES:
        raise ValueError(f"the schema is {size} bytes as compact JSON, more than the "
                         f"{MAX_SCHEMA_BYTES} allowed")  # fmt: skip
    problem = _problem(text, strict)
    if problem:
        raise ValueError(problem)
    return schema


def canonical(schema: dict) -> str:
    """The schema as the engine takes it: JSON with no spaces, keys in the order sent.

    Not sorted: the grammar writes properties in the schema's order, and callers choose it
    (a "reasoning" field before its "answer", say).
    """
    return json.dumps(schema, separators=(",", ":"))


def checked_schemas() -> int:
    """Schema checks remembered now, at most CHECKED_SCHEMAS."""
    return _problem.cache_info().currsize


@functools.lru_cache(maxsize=CHECKED_SCHEMAS)
def _problem(text: str, strict: bool) -> str | None:
    schema = json.loads(text)
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        message = exc.message if len(exc.message) <= 200 else exc.message[:200] + "..."
        return f"the schema is not a valid JSON schema: at {_where(exc.path)}: {message}"
    try:
        _walk(schema, (), schema, ())
    except ValueError as exc:
        return str(exc)
    return cost_problem(prepared(schema), strict)  # what the engine compiles: formats as patterns


def _walk(node: object, path: tuple, root: dict, implied: tuple[str, ...]) -> None:
    """Refuse the first keyword under node that the grammar compiler does not enforce."""
    if not isinstance(node, dict):
        return  # true, false: any value, no value
    assertions = set(node) - ANNOTATIONS
    for key in node:
        if key not in ANNOTATIONS and key not in KEYWORDS:
            raise _refuse(path, key, WHY.get(key, NOT_ENFORCED))
    types = node.get("type", implied)
    types = (types,) if isinstance(types, str) else tuple(types)
    for key in assertions & STRING_ONLY:
        if "string" not in types:
            raise _refuse(path, key, 'it needs "type": "string" beside it')
    for key in assertions & NUMBER_ONLY:
        if not {"integer", "number"} & set(types):
            raise _refuse(path, key, 'it needs "type": "integer" or "number" beside it')
    if "multipleOf" in node and (types != ("integer",) or node["multipleOf"] % 1):
        raise _refuse(
            path, "multipleOf", 'only a whole multipleOf with "type": "integer" is enforced'
        )
    if "multipleOf" in node and node["multipleOf"] > MAX_MULTIPLE_OF:
        why = f"the grammar compiler ignores a multipleOf above {MAX_MULTIPLE_OF}"
        raise _refuse(path, "multipleOf", why)
    if node.get("format") in EXACT_FORMATS and "pattern" in node:
        raise _refuse(path, "format", "it is compiled as a pattern: give format or pattern")
    if "format" in node and node["format"] not in FORMATS:
        why = f"format {node['format']!r} is not enforced; these are: {', '.join(sorted(FORMATS))}"
        raise _refuse(path, "format", why)
    why = pattern_problem(node["pattern"]) if "pattern" in node else None
    if why:
        raise _refuse(path, "pattern", why)
    for key in node.get("patternProperties", {}):
        why = pattern_problem(key)
        if why:
            raise _refuse((*path, "patternProperties"), key, why)
    for key in LENGTHS:
        beside = next((k for k in ("pattern", "format") if k in node), None)
        if key in node and beside:
            raise _refuse(path, key, f"the grammar compiler ignores it beside {beside}; "
                                     f"bound the length in a pattern instead")  # fmt: skip
    _check_range(node, path, types)
    _check_satisfiable(node, path)
    for key in ALONE:
        others = assertions - DEFINITIONS - {key}
        if key in node and others:
            raise _refuse(path, key, f"it ignores {sorted(others)[0]} beside it")
    for key in VALUES:
        others = assertions - DEFINITIONS - {key, "type"}
        if key in node and others:
            raise _refuse(path, key, f"it ignores {sorted(others)[0]} beside it")
        values = node.get("enum", []) if key == "enum" else [node.get("const")]
        if key in node and "type" in node:
            for value in values:
                if not Draft202012Validator({"type": node["type"]}).is_valid(value):
                    raise _refuse(path, key, f"{json.dumps(value)} is not of its type")
    if "allOf" in node and len(node["allOf"]) != 1:
        raise _refuse(path, "allOf", "only an allOf of one schema is enforced; merge them")
    if "$ref" in node:
        _resolve(node["$ref"], root, path)
    if isinstance(node.get("items"), list):
        raise _refuse(path, "items", "a list of items is not enforced; use prefixItems")
    missing = [n for n in node.get("required", []) if n not in node.get("properties", {})]
    if missing:
        raise _refuse(path, "required", f"{missing[0]!r} is not in properties")
    # Keywords the compiler ignores were refused above: their schemas are never reached.
    for key in (*SCHEMA_MAPS, "patternProperties"):
        for name, sub in node.get(key, {}).items():
            _walk(sub, (*path, key, name), root, ())
    for key in SCHEMA_LISTS:
        for i, sub in enumerate(node.get(key, [])):
            _walk(sub, (*path, key, i), root, ())
    for key in SCHEMA_ONE:
        if key in node:
            _walk(node[key], (*path, key), root, ("string",) if key == "propertyNames" else ())


def _check_range(node: dict, path: tuple, types: tuple) -> None:
    """Refuse integer bounds that are not whole, and a range that no number xgrammar can
    write lies in (whole numbers for integers, else at most DECIMALS decimals)."""
    bounds = {k: Decimal(repr(node[k])) for k in NUMBER_ONLY if k in node}
    if not bounds:
        return
    whole = "number" not in types
    for key, value in bounds.items():
        if not value.is_finite():  # NaN and Infinity parse as JSON numbers here
            raise _refuse(path, key, "a bound must be a finite number")
        if whole and value != value.to_integral_value():
            raise _refuse(path, key, 'a bound of "type": "integer" must be a whole number')
    step = Decimal(1) if whole else Decimal(10) ** -DECIMALS
    low, high = None, None  # the least and the greatest writable number in range
    for key, value in bounds.items():
        exclusive = key.startswith("exclusive")
        if key.endswith("inimum"):
            first = (value / step).to_integral_value(ROUND_CEILING) * step
            first += step if exclusive and first == value else 0
            low = first if low is None else max(low, first)
        else:
            last = (value / step).to_integral_value(ROUND_FLOOR) * step
            last -= step if exclusive and last == value else 0
            high = last if high is None else min(high, last)
    if low is not None and high is not None and low > high:
        key = next(k for k in ("exclusiveMaximum", "maximum") if k in bounds)
        kind = "integer" if whole else f"number of at most {DECIMALS} decimals"
        raise _refuse(path, key, f"no {kind} lies in the range: the grammar compiler writes "
                                 f"no other, and would allow no answer")  # fmt: skip


def _check_satisfiable(node: dict, path: tuple) -> None:
    """Refuse counts no value meets, an empty enum, and a required property whose schema is
    false: the compiler would refuse them too, but only once the request is running."""
    counts = {k: node[k] for k in COUNTS if _is_count(node.get(k))}
    # The most items or properties a closed array or object can hold.
    if node.get("items") is False:
        counts["maxItems"] = min(counts.get("maxItems", math.inf), len(node.get("prefixItems", [])))
    if node.get("additionalProperties") is False and not node.get("patternProperties"):
        most = len(node.get("properties", {}))
        counts["maxProperties"] = min(counts.get("maxProperties", math.inf), most)
    for low, high in (("minItems", "maxItems"), ("minLength", "maxLength"),
                      ("minProperties", "maxProperties")):  # fmt: skip
        if low in counts and high in counts and counts[low] > counts[high]:
            key = high if high in node and node[high] == counts[high] else low
            raise _refuse(path, key, f"at least {counts[low]:g} and at most {counts[high]:g}: "
                                     f"no value would fit")  # fmt: skip
    if node.get("enum") == []:
        raise _refuse(path, "enum", "an empty enum allows no value")
    properties = node.get("properties", {})
    barred = [n for n in node.get("required", []) if properties.get(n) is False]
    if barred:
        raise _refuse(path, "required", f"{barred[0]!r} is required, but its schema is false")


def _is_count(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def _resolve(ref: str, root: dict, path: tuple) -> None:
    """Refuse a $ref that does not name a schema inside this one ("#", "#/$defs/...")."""
    if ref != "#" and not ref.startswith("#/"):
        raise _refuse(path, "$ref", f"{ref!r} is not a JSON pointer into this schema (#/...)")
    node: object = root
    for part in ref[2:].split("/") if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise _refuse(path, "$ref", f"{ref!r} names nothing in this schema")
    if not isinstance(node, dict | bool):
        raise _refuse(path, "$ref", f"{ref!r} names no schema")


def _refuse(path: tuple, keyword: str, why: str) -> ValueError:
    return ValueError(f"the schema's {keyword} at {_where((*path, keyword))} is not supported: "
                      f"{why}")  # fmt: skip


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    return {list: "an array", str: "a string", type(None): "null"}.get(type(value), "a number")
