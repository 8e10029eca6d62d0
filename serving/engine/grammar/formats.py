"""A schema as the grammar compiler is to read it: date formats and patterns it would
misread (see enforced, the table of what it enforces), rewritten into equivalents it
enforces exactly.

- `"format"` in EXACT_FORMATS (`date`, `date-time`) is compiled as the patterns below:
  every month its own days, 29 February in leap years only, years 0001-9999 (as Python's
  date reads them), times 00:00:00-23:59:59 with up to 6 fraction digits and a Z or
  +hh:mm offset. What they write is RFC 3339's, in its upper-case spelling.
- A group made optional with `?` loses its first character when a repeat follows it inside
  (`a(-[0-9]{1,3})?` writes `a12`), so `)?` becomes the same `){0,1}`, which is enforced.
"""

from __future__ import annotations

from serving.engine.grammar.enforced import EXACT_FORMATS

YEAR = "(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"
MONTH_DAY = (
    "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    "|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
# years divisible by 4, but of the centuries only those divisible by 400 (0000 is no year)
LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
DATE = f"(?:{YEAR}-{MONTH_DAY}|{LEAP_YEAR}-02-29)"
TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?"
OFFSET = "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
PATTERNS = dict(zip(EXACT_FORMATS, (f"^{DATE}$", f"^{DATE}T{TIME}{OFFSET}$"), strict=True))


# Where a schema holds schemas; anything else (const, enum, default, examples) is a value,
# copied as it is even when it looks like a schema.
SCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("prefixItems", "anyOf", "allOf", "oneOf")
SCHEMA_ONE = ("additionalProperties", "items", "unevaluatedItems", "unevaluatedProperties",
              "propertyNames", "contains", "not", "if", "then", "else")  # fmt: skip


def prepared(node: object) -> object:
    """node (a parsed JSON schema) with each string's `format` in PATTERNS replaced by its
    pattern, and every pattern (patternProperties' keys too) made safe for the compiler."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out[key] = {name: prepared(sub) for name, sub in node[key].items()}
    for key in SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out[key] = [prepared(sub) for sub in node[key]]
    for key in SCHEMA_ONE:
        if key in node:
            out[key] = prepared(node[key])
    if isinstance(node.get("items"), list):  # the older list form
        out["items"] = [prepared(sub) for sub in node["items"]]
    if isinstance(node.get("patternProperties"), dict):
        out["patternProperties"] = {
            optional_groups_counted(key): prepared(sub)
            for key, sub in node["patternProperties"].items()
        }
    fmt, types = node.get("format"), node.get("type")
    strings = types == "string" or (isinstance(types, list) and "string" in types)
    if isinstance(fmt, str) and fmt in PATTERNS and strings and "pattern" not in node:
        del out["format"]
        out["pattern"] = PATTERNS[fmt]
    if isinstance(out.get("pattern"), str):
        out["pattern"] = optional_groups_counted(out["pattern"])
    for key in COUNTS:  # JSON Schema's 3.0 is the integer 3; the compiler takes ints only
        value = out.get(key)
        if isinstance(value, float) and value.is_integer():
            out[key] = int(value)
    return out


def tag_schemas(node: object):
    """The {"type": "json_schema"} nodes of a structural tag (parsed JSON), each a dict the
    caller may change in place."""
    if isinstance(node, list):
        for item in node:
            yield from tag_schemas(item)
    elif isinstance(node, dict):
        if node.get("type") == "json_schema":
            yield node
            return
        for value in node.values():
            yield from tag_schemas(value)


COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties")


def optional_groups_counted(pattern: str) -> str:
    """pattern with each group's `?` quantifier spelt {0,1}: `(ab)?` -> `(ab){0,1}`. Escapes
    and character classes are copied as they are; `)??` (lazy) stays lazy."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern.startswith("[]", i) or pattern.startswith("[^]", i):  # "]" first is literal
                out.append(pattern[i : i + (2 if pattern[i + 1] == "]" else 3)])
                i += 2 if pattern[i + 1] == "]" else 3
                continue
        elif c == ")" and pattern.startswith("?", i + 1):
            out.append("){0,1}")
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)
