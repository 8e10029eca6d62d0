"""The EBNF text xgrammar prints for a schema, fixed up so that it reads back as meant."""

from __future__ import annotations

import re

# U+0000..U+001F, as an EBNF class spells it: \u001f, not \x1f, which xgrammar would read on
# into the class's next characters when they are hex digits ([^\0-\x1fa] is [^\0-\u01fa]).
CONTROLS = "\\0-\\u001f"
_BYTE_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{2}|.)", re.DOTALL)  # an escape: \xHH, or \ and one


def reparseable(ebnf: str) -> str:
    r"""ebnf as xgrammar prints it, with each \xHH escape spelled \u00HH.

    xgrammar prints U+0080..U+00FF as \xHH but reads hex digits after \x for as long as
    they come: a schema's "ïc", printed "\xefc", would be parsed back as U+0EFC.
    """
    return _BYTE_ESCAPE.sub(
        lambda m: "\\u00" + m[1][1:] if m[1][0] == "x" and len(m[1]) == 3 else m[0], ebnf
    )


def no_raw_controls(ebnf: str) -> str:
    """ebnf with U+0000..U+001F taken out of every negated character class.

    JSON strings may hold control characters only escaped, but xgrammar's rules for strings
    with a length bound or a pattern are negated classes such as [^"\\\r\n], which let a raw
    one through (and a strict parser then refuses the output). Negated classes only ever
    stand for string characters in a JSON grammar; quoted literals are left as they are.
    """
    out, i, quoted, in_class = [], 0, False, False
    while i < len(ebnf):
        c = ebnf[i]
        if c == "\\":  # an escape, in a literal or a class: copy it whole
            out.append(ebnf[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == '"':
            quoted = not quoted
        elif not quoted and c == "[":
            in_class = True
            if ebnf.startswith("[^", i) and not ebnf.startswith(CONTROLS, i + 2):
                out.append("[^" + CONTROLS)
                i += 2
                continue
        out.append(c)
        i += 1
    return "".join(out)
