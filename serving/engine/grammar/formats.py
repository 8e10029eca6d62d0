"""Date formats as patterns the grammar compiler enforces exactly.

xgrammar's own `date` and `date-time` rules allow days a month lacks (02-31), so a schema's
`"format": "date"` / `"date-time"` is compiled as the pattern below instead: every month
its own days, 29 February in leap years only, years 0001-9999 (as Python's date reads
them), times 00:00:00-23:59:59 with up to 6 fraction digits and a Z or +hh:mm offset. What
it writes is RFC 3339's, in its upper-case spelling.
"""

from __future__ import annotations

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
PATTERNS = {"date": f"^{DATE}$", "date-time": f"^{DATE}T{TIME}{OFFSET}$"}


def with_date_patterns(node: object) -> object:
    """node (a parsed JSON schema) with each `format` in PATTERNS replaced by its pattern."""
    if isinstance(node, list):
        return [with_date_patterns(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: with_date_patterns(value) for key, value in node.items()}
    fmt, types = node.get("format"), node.get("type")
    strings = types == "string" or (isinstance(types, list) and "string" in types)
    if isinstance(fmt, str) and fmt in PATTERNS and strings:
        del out["format"]
        out["pattern"] = PATTERNS[fmt]
    return out
