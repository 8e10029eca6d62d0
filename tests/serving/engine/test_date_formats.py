"""What the grammar compiler is given instead of what it misreads: the date patterns for
`format: date` / `date-time`, against Python's calendar (every day of every month of years
around each leap rule, and nothing else), and optional groups spelt {0,1}."""

import datetime
import re

from serving.engine.grammar.formats import PATTERNS, optional_groups_counted, prepared

YEARS = [*range(1, 30), *range(1890, 2110), 100, 400, 1600, 1700, 1800, 2400, 9996, 9999]


def test_the_date_pattern_is_the_calendar():
    date = re.compile(PATTERNS["date"])
    for y in YEARS:
        for m in range(1, 13):
            for d in range(1, 32):
                text = f"{y:04d}-{m:02d}-{d:02d}"
                try:
                    datetime.date.fromisoformat(text)
                    real = True
                except ValueError:
                    real = False
                assert bool(date.fullmatch(text)) == real, text
    assert not date.fullmatch("0000-01-01") and not date.fullmatch("2024-1-01")


def test_the_date_time_pattern_takes_rfc3339_times_python_reads():
    stamp = re.compile(PATTERNS["date-time"])
    good = ["2024-02-29T23:59:59Z", "1999-12-31T00:00:00.123456+05:30", "2023-06-01T12:30:00-08:00"]
    bad = ["2023-02-29T00:00:00Z", "2024-01-01T24:00:00Z", "2024-01-01T10:60:00Z",
           "2024-01-01T10:00:00", "2024-01-01 10:00:00Z", "2024-01-01T10:00:00.1234567Z"]  # fmt: skip
    for text in good:
        assert stamp.fullmatch(text) and datetime.datetime.fromisoformat(text).tzinfo, text
    assert not any(stamp.fullmatch(text) for text in bad)


def test_only_string_date_formats_become_patterns_and_patterns_are_rewritten():
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "format": "date"},
        "b": {"anyOf": [{"type": ["string", "null"], "format": "date-time"}]},
        "c": {"type": "string", "format": "uuid"},
        "d": {"type": "string", "pattern": "^a(-[0-9]{1,3})?$"},
    }, "patternProperties": {"^k(_[0-9]+)?$": {"type": "integer"}}}  # fmt: skip
    out = prepared(schema)
    props = out["properties"]
    assert props["a"] == {"type": "string", "pattern": optional_groups_counted(PATTERNS["date"])}
    assert props["b"]["anyOf"][0]["pattern"] == optional_groups_counted(PATTERNS["date-time"])
    assert props["c"] == schema["properties"]["c"]
    assert props["d"]["pattern"] == "^a(-[0-9]{1,3}){0,1}$"
    assert list(out["patternProperties"]) == ["^k(_[0-9]+){0,1}$"]


def test_only_a_groups_question_mark_is_rewritten():
    cases = {
        r"a(-[0-9]{1,3})?": r"a(-[0-9]{1,3}){0,1}",
        r"(?:a|b)?x": r"(?:a|b){0,1}x",  # the group's own (? is no quantifier
        r"a(b)??": r"a(b){0,1}?",  # lazy stays lazy
        r"\)?x?": r"\)?x?",  # an escaped paren, a character's ?
        r"[)?]": r"[)?]",  # inside a class
        r"[]?)](c)?": r"[]?)](c){0,1}",  # ] first in a class is literal
    }
    for pattern, expected in cases.items():
        assert optional_groups_counted(pattern) == expected
        assert re.compile(expected).pattern  # still a regular expression


def test_values_that_look_like_schemas_are_left_as_they_are():
    """const, enum, default and examples hold values, not schemas: rewriting one would make
    the grammar force another value than the one given."""
    looks = {"type": "string", "format": "date", "pattern": "a(b)?"}
    schema = {"type": "object", "properties": {"v": {"const": looks}, "w": {"enum": [looks]}},
              "default": looks, "examples": [looks]}  # fmt: skip
    out = prepared(schema)
    assert out["properties"]["v"]["const"] == looks and out["properties"]["w"]["enum"] == [looks]
    assert out["default"] == looks and out["examples"] == [looks]
