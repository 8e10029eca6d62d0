"""The date patterns the grammar compiles for `format: date` / `date-time`, against Python's
calendar: every day of every month of years around each leap rule, and nothing else."""

import datetime
import re

from serving.engine.grammar.formats import PATTERNS, with_date_patterns

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


def test_only_string_date_formats_become_patterns():
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "format": "date"},
        "b": {"anyOf": [{"type": ["string", "null"], "format": "date-time"}]},
        "c": {"type": "string", "format": "uuid"},
    }}  # fmt: skip
    out = with_date_patterns(schema)["properties"]
    assert out["a"] == {"type": "string", "pattern": PATTERNS["date"]}
    assert out["b"]["anyOf"][0] == {"type": ["string", "null"], "pattern": PATTERNS["date-time"]}
    assert out["c"] == schema["properties"]["c"]
