"""What a schema costs to compile, estimated before compiling: the check behind its 400.

Three things xgrammar builds grow with a schema, and the estimate is their sum (refused past
MAX_COMPILE_S), the part costing most named in the 400:
- A pattern's counted repeats expand into states of its automaton, each with a pass over
  the vocabulary and a token mask to sort: a pattern costs its expanded length and the
  square of it; more per state for a wide
  class (`.`, `[^x]`: most tokens stay live), more again for a negated category (`\\S`,
  `\\W`: expanded into many ranges).
- A variable repeat inside another counted repeat, with nothing between the iterations that
  the inner class cannot match (`([a-z]{1,10}){1,50}`, `(\\w{1,20} ?){1,50}`), leaves every
  split of the text into iterations live at once: about outer count x inner length / inner
  minimum states per position, each holding about as many tokens as the class has
  characters. For a wide class the outer repeat's continuation matches what the inner does
  as well, and the cost grows faster in the outer count (fitted as its 1.5th power). A
  separator the inner class excludes (`([^,]{1,100},){1,5}`) settles the split, but only
  after it: a token reads on across it, and about a sixth of the splits stay live.
- Each property of an object is a rule, and compiling costs about the square of the
  grammar's rules: the properties of every object in the schema summed, then squared (the
  parts share it by their properties). An object that allows properties it does not name
  (not strict, the API's default, and no `"additionalProperties": false`) also holds a rule
  per prefix of its names (the keys it must tell apart from its own), and its own rules
  for the rest. A `$ref` is a reference to one rule ($defs cost once); `minItems`,
  `minLength` and `maxLength` are counted by xgrammar, not expanded: nearly free; an `enum`
  is one rule, a state per character of its values.
The constants are CPU seconds on the demo tokenizer (4096 tokens) for xgrammar 0.2.9;
`python -m bench.grammar_cost` prints each shape's estimate beside its measured compile
(tests/serving/engine/test_grammar_cost.py holds them within a band): rerun it after
changing either. A larger vocabulary costs more per state: the compile time limit
(compiler.py) bounds what the estimate misses.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from re import _constants as sre  # the parser's opcodes (private, stable since 3.11)
from re import _parser as sre_parse

from serving.engine.grammar.formats import SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_ONE

MAX_COMPILE_S = 2.0  # the estimated compile time refused past (the time limit is 10 s)
STATE_S = 5e-5  # per expanded position of a pattern
NARROW_S = 4.2e-8  # per (expanded position)^2 of a pattern of narrow classes
WIDE_S = 2.8e-7  # the same with a wide class (., [^x])
CATEGORY_S = 1e-6  # the same with a negated category (\S, \W, \D)
SPLIT_S = 7e-5  # per live split (see above) and character of a narrow inner class
SPLIT_WIDE_S = 1.8e-3  # per live split of a wide inner class, x the outer count^0.5
SEPARATED = 6  # live splits / those left when a separator the inner class excludes follows
ENUM_S = 1e-6  # per character of an enum's values
RULE_S = 1.2e-5  # per (rules of the schema's objects)^2
LOOSE_RULES = 5  # the rules of an object's other properties, beside its names' prefixes
WIDE_CLASS = 128  # a class of more characters than this is wide
REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)
GROUPS = (sre.SUBPATTERN, sre.ATOMIC_GROUP)
CATEGORIES = {sre.CATEGORY_DIGIT: r"\d", sre.CATEGORY_NOT_DIGIT: r"\D", sre.CATEGORY_SPACE: r"\s",
              sre.CATEGORY_NOT_SPACE: r"\S", sre.CATEGORY_WORD: r"\w", sre.CATEGORY_NOT_WORD: r"\W"}  # fmt: skip
NEGATED = (sre.CATEGORY_NOT_DIGIT, sre.CATEGORY_NOT_SPACE, sre.CATEGORY_NOT_WORD)


@dataclass(frozen=True)
class Part:
    """One costly part of a schema: its JSON pointer's path, keyword, estimated seconds."""

    path: tuple
    keyword: str
    seconds: float


def cost_problem(schema: object, strict: bool = False) -> str | None:
    """Why schema (parsed, as the compiler reads it: formats.prepared) would compile too
    slowly, naming its costliest part; None when its estimated cost is within budget.
    strict: properties the schema does not name are refused (the default, not, costs more)."""
    parts = costly_parts(schema, (), strict)
    total = sum(p.seconds for p in parts)
    if total <= MAX_COMPILE_S:
        return None
    worst = max(parts, key=lambda p: p.seconds)
    where = pointer((*worst.path, worst.keyword))
    fix = {"properties": "send fewer of them", "enum": "send fewer values"}.get(
        worst.keyword, "shorten its repeats"
    )
    return (f"the schema would take about {total:.3g} s to compile, more than the "
            f"{MAX_COMPILE_S:g} s allowed; its costliest part is the {worst.keyword} at "
            f"{where} (about {worst.seconds:.3g} s): {fix}")  # fmt: skip


def costly_parts(node: object, path: tuple, strict: bool = False) -> list[Part]:
    """Every pattern and object under node with its estimated compile seconds (they sum to
    the estimate)."""
    patterns, objects = [], []
    _walk(node, path, strict, patterns, objects)
    rules = sum(p.seconds for p in objects)  # an object's part holds its rules until here
    return patterns + [Part(p.path, p.keyword, RULE_S * rules * p.seconds) for p in objects]


def _walk(node: object, path: tuple, strict: bool, patterns: list, objects: list) -> None:
    if not isinstance(node, dict):
        return
    if isinstance(node.get("pattern"), str):
        patterns.append(Part(path, "pattern", pattern_seconds(node["pattern"])))
    keys = node.get("patternProperties")
    for key in keys if isinstance(keys, dict) else ():
        patterns.append(Part((*path, "patternProperties"), key, pattern_seconds(key)))
    if isinstance(node.get("enum"), list):
        values = sum(len(json.dumps(v)) for v in node["enum"])
        patterns.append(Part(path, "enum", ENUM_S * values))
    properties = node.get("properties")
    if isinstance(properties, dict) and properties:
        objects.append(Part(path, "properties", object_rules(node, strict)))
    for key in (*SCHEMA_MAPS, "patternProperties"):
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                _walk(sub, (*path, key, name), strict, patterns, objects)
    for key in (*SCHEMA_LISTS, "items"):
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                _walk(sub, (*path, key, i), strict, patterns, objects)
    for key in SCHEMA_ONE:
        if isinstance(node.get(key), dict):
            _walk(node[key], (*path, key), strict, patterns, objects)


def object_rules(node: dict, strict: bool) -> float:
    """The grammar rules of an object's properties (node["properties"], a non-empty dict)."""
    names = node["properties"]
    other = node.get("additionalProperties", None if strict else True)
    if other is None or other is False:
        return float(len(names))
    prefixes = {name[:i] for name in names for i in range(1, len(name) + 1)}
    return float(len(names) + len(prefixes) + LOOSE_RULES)


def pattern_seconds(pattern: str) -> float:
    """The estimated compile seconds of one pattern (0 if Python cannot parse it: the
    schema's other checks refuse it)."""
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError):
        return 0.0
    size, width, splits = _shape(parsed)
    per_state = CATEGORY_S if width > 2 else WIDE_S if width else NARROW_S
    return STATE_S * size + per_state * float(size) ** 2 + splits


def _shape(items) -> tuple[float, int, float]:
    """(expanded positions, widest class: 0 narrow, 1 wide, 3 a negated category, seconds of
    the live splits of nested variable repeats) of parsed items."""
    size, width, splits = 0.0, 0, 0.0
    for op, arg in items:
        if op in REPEATS:
            low, high, sub = arg
            count = max(low if high == sre.MAXREPEAT else high, 1)
            sub_size, sub_width, sub_splits = _shape(sub)
            size += sub_size * count
            width = max(width, sub_width)
            splits += sub_splits * count + (_split_seconds(sub, count) if count > 1 else 0.0)
        elif op is sre.BRANCH or op in (*GROUPS, sre.ASSERT, sre.ASSERT_NOT):
            for sub in arg[1] if op is sre.BRANCH else [arg[-1]]:
                sub_size, sub_width, sub_splits = _shape(sub)
                size += sub_size
                width = max(width, sub_width)
                splits += sub_splits
        elif op is not sre.AT:
            size += 1
            width = max(width, _width(op, arg))
    return size, width, splits


def _split_seconds(body, count: int) -> float:
    """The cost of the live splits of a repeat's body repeated count times: of each variable
    repeat of one class in it, fewer where a separator its class excludes follows."""
    items = list(_flat(body))
    seconds = 0.0
    for i, (op, arg) in enumerate(items):
        if op not in REPEATS or arg[1] == arg[0] or len(arg[2]) != 1:
            continue
        low, high, ((c_op, c_arg),) = arg
        if c_op in REPEATS or c_op is sre.BRANCH or c_op in GROUPS:
            continue
        others = items[:i] + items[i + 1 :]
        length = max(low + 1 if high == sre.MAXREPEAT else high, 1)
        live = count * length / max(low, 1)
        if any(_separates(o, c_op, c_arg) for o in others):
            live /= SEPARATED
        if _width(c_op, c_arg):
            seconds += SPLIT_WIDE_S * live * math.sqrt(count)
        else:
            seconds += SPLIT_S * live * _characters(c_op, c_arg)
    return seconds


def _flat(items):
    """items with groups opened: the sequence a repeat's body matches."""
    for op, arg in items:
        if op in GROUPS:
            yield from _flat(arg[-1])
        else:
            yield op, arg


def _separates(item, c_op, c_arg) -> bool:
    """Whether item is always there and matches nothing the class (c_op, c_arg) does."""
    op, arg = item
    if op in REPEATS:
        return arg[0] >= 1 and len(arg[2]) == 1 and _separates(arg[2][0], c_op, c_arg)
    if op is not sre.LITERAL:
        return False
    return not _matches(c_op, c_arg, chr(arg))


def _matches(op, arg, char: str) -> bool:
    """Whether the class (op, arg) matches char."""
    if op is sre.ANY:
        return char != "\n"
    if op is sre.LITERAL:
        return ord(char) == arg
    if op is sre.NOT_LITERAL:
        return ord(char) != arg
    if op is sre.CATEGORY:
        return re.fullmatch(CATEGORIES.get(arg, "."), char) is not None
    if op is not sre.IN:
        return True  # anything else: assume it may
    negate = any(item_op is sre.NEGATE for item_op, _ in arg)
    hit = any(
        (item[0] <= ord(char) <= item[1]) if item_op is sre.RANGE else _matches(item_op, item, char)
        for item_op, item in arg if item_op is not sre.NEGATE
    )  # fmt: skip
    return hit != negate


def _characters(op, arg) -> int:
    """How many characters a narrow class matches."""
    if op is sre.CATEGORY:
        return {sre.CATEGORY_DIGIT: 10, sre.CATEGORY_SPACE: 6}.get(arg, 63)
    if op is not sre.IN:
        return 1
    total = 0
    for item_op, item in arg:
        total += item[1] - item[0] + 1 if item_op is sre.RANGE else _characters(item_op, item)
    return total


def _width(op, arg) -> int:
    """How wide one position is: 0 a few characters, 1 many (any, a negation, a big class),
    3 a negated category (many ranges)."""
    if op is sre.CATEGORY:
        return 3 if arg in NEGATED else 0
    if op in (sre.ANY, sre.NOT_LITERAL):
        return 1
    if op is not sre.IN:
        return 0
    widths = [_width(item_op, item) for item_op, item in arg if item_op is sre.CATEGORY]
    if any(item_op is sre.NEGATE for item_op, _ in arg):
        return max([1, *widths])
    return max([0, *widths, int(_characters(op, arg) > WIDE_CLASS)])


def pointer(path) -> str:
    """A JSON pointer to path in the schema (RFC 6901); "/" for the schema itself."""
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return "/" + "/".join(parts) if parts else "/"
