"""What a schema costs to compile, estimated before compiling: the check behind its 400.

xgrammar expands a pattern's counted repeats into states of the grammar's automaton and
builds a token mask per state, so a pattern's cost grows with the square of its expanded
size, more for wide classes (`.`, `[^x]`: many tokens to sort per state), far more for a
variable repeat of a wide class nested in another repeat (every split of the text is a live
parse). An object's properties not in `required` cost superlinearly in their number (each
subset of those that follow is a rule). Costs add up over every pattern and object in the
schema, so the estimate is their sum and is refused past MAX_COMPILE_S. The constants are
seconds on the demo tokenizer (4096 tokens), fitted to xgrammar 0.2.9's compile times and
rounded up; rerun `python -m bench.grammar_cost` after changing either. A larger vocabulary
costs more per state: the compile time limit (compiler.py) bounds what the estimate misses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from re import _constants as sre  # the parser's opcodes (private, stable since 3.11)
from re import _parser as sre_parse

from serving.engine.grammar.formats import SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_ONE

MAX_COMPILE_S = 2.0  # the estimated compile time refused past (the time limit is 10 s)
NARROW_S = 4.2e-8  # per (expanded position)^2 of a pattern of narrow classes: [a-z]{1,1000} 0.04 s
WIDE_S = 2.8e-7  # the same with a wide class (., [^x], \S): .{1,1000} 0.28 s
NESTED = 6.0  # x the inner span, for a variable wide repeat inside another repeat
OPTIONAL_S = (1e-6, 3.3, 1000, 5.3)  # a * n^2 + b * (m / c)^d: n properties, m optional
WIDE_CLASS = 128  # a class of more characters than this is wide
REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)


@dataclass(frozen=True)
class Part:
    """One costly part of a schema: its JSON pointer's path, keyword, estimated seconds."""

    path: tuple
    keyword: str
    seconds: float


def cost_problem(schema: object) -> str | None:
    """Why schema (parsed, as the compiler reads it: formats.prepared) would compile too
    slowly, naming its costliest part; None when its estimated cost is within budget."""
    parts = list(costly_parts(schema, ()))
    total = sum(p.seconds for p in parts)
    if total <= MAX_COMPILE_S:
        return None
    worst = max(parts, key=lambda p: p.seconds)
    where = pointer((*worst.path, worst.keyword))
    fix = "require more of them" if worst.keyword == "properties" else "shorten its repeats"
    return (f"the schema would take about {total:.3g} s to compile, more than the "
            f"{MAX_COMPILE_S:g} s allowed; its costliest part is the {worst.keyword} at "
            f"{where} (about {worst.seconds:.3g} s): {fix}")  # fmt: skip


def costly_parts(node: object, path: tuple):
    """Every pattern and object under node with its estimated compile seconds."""
    if not isinstance(node, dict):
        return
    if isinstance(node.get("pattern"), str):
        yield Part(path, "pattern", pattern_seconds(node["pattern"]))
    keys = node.get("patternProperties")
    for key in keys if isinstance(keys, dict) else ():
        yield Part((*path, "patternProperties"), key, pattern_seconds(key))
    properties = node.get("properties")
    if isinstance(properties, dict) and properties:
        required = node.get("required") if isinstance(node.get("required"), list) else []
        optional = len(set(properties) - set(required))
        a, b, c, d = OPTIONAL_S
        yield Part(path, "properties", a * len(properties) ** 2 + b * (optional / c) ** d)
    for key in (*SCHEMA_MAPS, "patternProperties"):
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                yield from costly_parts(sub, (*path, key, name))
    for key in (*SCHEMA_LISTS, "items"):
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                yield from costly_parts(sub, (*path, key, i))
    for key in SCHEMA_ONE:
        if isinstance(node.get(key), dict):
            yield from costly_parts(node[key], (*path, key))


def pattern_seconds(pattern: str) -> float:
    """The estimated compile seconds of one pattern (0 if Python cannot parse it: the
    schema's other checks refuse it)."""
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError):
        return 0.0
    size, wide, nested = _shape(parsed, inside=False)
    return (WIDE_S if wide else NARROW_S) * float(size) ** 2 * max(nested, 1.0)


def _shape(items, inside: bool) -> tuple[float, bool, float]:
    """(expanded positions, any wide class, nesting factor) of parsed items; inside: within
    a repeat of more than one."""
    size, wide, nested = 0.0, False, 1.0
    for op, arg in items:
        if op in REPEATS:
            low, high, sub = arg
            count = max(low if high == sre.MAXREPEAT else high, 1)
            sub_size, sub_wide, sub_nested = _shape(sub, inside or count > 1)
            size += sub_size * count
            wide |= sub_wide
            nested = max(nested, sub_nested)
            if inside and sub_wide and high != low:  # a variable wide repeat in a repeat
                span = (high if high != sre.MAXREPEAT else low + 1) - low
                nested = max(nested, NESTED * span * sub_nested)
        elif op is sre.BRANCH or op in (sre.SUBPATTERN, sre.ATOMIC_GROUP, sre.ASSERT, sre.ASSERT_NOT):  # fmt: skip
            subs = arg[1] if op is sre.BRANCH else [arg[-1]]
            for sub in subs:
                sub_size, sub_wide, sub_nested = _shape(sub, inside)
                size += sub_size
                wide |= sub_wide
                nested = max(nested, sub_nested)
        elif op is not sre.AT:
            size += 1
            wide |= _wide(op, arg)
    return size, wide, nested


def _wide(op, arg) -> bool:
    """Whether one position matches many characters: any, a negation, a big class."""
    if op in (sre.ANY, sre.NOT_LITERAL):
        return True
    if op is sre.CATEGORY:
        return arg not in (sre.CATEGORY_DIGIT, sre.CATEGORY_WORD)
    if op is not sre.IN:
        return False
    chars = 0
    for item_op, item in arg:
        if item_op is sre.NEGATE or (item_op is sre.CATEGORY and _wide(item_op, item)):
            return True
        chars += item[1] - item[0] + 1 if item_op is sre.RANGE else 1
    return chars > WIDE_CLASS


def pointer(path) -> str:
    """A JSON pointer to path in the schema (RFC 6901); "/" for the schema itself."""
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return "/" + "/".join(parts) if parts else "/"
