"""Which `pattern` regexes the grammar compiler enforces as written: the reasons behind a
pattern's 400.

xgrammar 0.2.9 matches a pattern whole (as if anchored) and reads it its own way: it
drops a lookahead (?=..) or (?!..) with a warning, ignores ^ and $ anywhere but the ends,
matches \\A and \\Z as the letters A and Z, and emits ", \\ and control characters unescaped.
Each of those would let through an answer the pattern refuses (or broken JSON), so the
pattern is refused instead; Python's own parser (the metaschema's check) reads it here.
"""

from __future__ import annotations

import re
from re import _constants as sre  # the parser's opcodes (private, stable since 3.11)
from re import _parser as sre_parse  # how Python (and the metaschema's check) reads a pattern

# ", \\ (an escaped backslash), a control character or an escape for one
UNSAFE = re.compile(r'"|\\\\|\\[nrtfv0c]|\\x[01]|\\u00[01]|[\x00-\x1f]')
# xgrammar expands a pattern's counted repeats into its automaton, nested counts multiplied,
# at a cost that grows faster than the count. Past this count a pattern is refused outright;
# 1000 allows any realistic pattern. Below it, what a schema's repeats (nested ones too) cost
# to compile is estimated, and refused past the budget, in serving/engine/grammar/cost.py.
# Length keywords and maxItems are no such cost: xgrammar counts them, 1 ms at 10**6.
MAX_PATTERN_REPEAT = 1000
REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)
NOT_REGULAR = {
    sre.ASSERT: "a lookahead or lookbehind",
    sre.ASSERT_NOT: "a negative lookahead or lookbehind",
    sre.GROUPREF: "a backreference",
    sre.GROUPREF_EXISTS: "a conditional group",
}


def pattern_problem(pattern: str) -> str | None:
    """Why the grammar compiler would not enforce pattern as written; None if it would."""
    if UNSAFE.search(pattern):
        return 'a pattern may not name ", \\ or a control character'
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, OverflowError, RecursionError):  # the metaschema's check refuses these
        return "it is not a regular expression"
    if _repeats(parsed) > MAX_PATTERN_REPEAT:
        return (f"it repeats a part more than {MAX_PATTERN_REPEAT} times (nested counts "
                f"multiply), too many to compile in good time")  # fmt: skip
    return _unenforced(parsed, first=True, last=True)


def _repeats(items, outer: int = 1) -> int:
    """The most times the pattern (parsed: a list of opcodes) expands any one part."""
    most = outer
    for op, arg in items:
        if op in REPEATS:
            low, high, sub = arg  # an unbounded repeat expands only its minimum
            most = max(most, _repeats(sub, outer * max(low if high == sre.MAXREPEAT else high, 1)))
        elif op is sre.BRANCH:
            most = max([most] + [_repeats(branch, outer) for branch in arg[1]])
        elif op in (sre.SUBPATTERN, sre.ASSERT, sre.ASSERT_NOT, sre.ATOMIC_GROUP):
            most = max(most, _repeats(arg[-1], outer))
    return most


def _unenforced(items, first: bool, last: bool) -> str | None:
    """The first construct in items the compiler would drop or misread. first/last: items
    begin/end the whole pattern, where ^ and $ mean what the compiler's whole match does."""
    for k, (op, arg) in enumerate(items):
        at_first, at_last = first and k == 0, last and k == len(items) - 1
        if op in NOT_REGULAR:
            return f"{NOT_REGULAR[op]} cannot be enforced by the grammar compiler"
        if op is sre.AT:
            if (arg is sre.AT_BEGINNING and at_first) or (arg is sre.AT_END and at_last):
                continue
            where = {sre.AT_BEGINNING: "^ only at the start", sre.AT_END: "$ only at the end"}
            return (
                f"the grammar compiler reads {where[arg]} of the pattern"
                if arg in where
                else r"\A, \Z, \b and \B are not enforced; use ^ and $"
            )
        if op is sre.BRANCH:
            subs = arg[1]
        elif op in (sre.SUBPATTERN, sre.ATOMIC_GROUP):
            subs = [arg[-1]]
        elif op in REPEATS:
            subs, at_first, at_last = [arg[2]], False, False
        else:
            continue
        for sub in subs:
            why = _unenforced(sub, at_first, at_last)
            if why:
                return why
    return None
