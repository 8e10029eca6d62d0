"""A file of Workers-AI requests, one JSON body per line, read and checked before any is sent.

`loraserve batch submit` (serving/batch/cli.py) sends nothing from a file with a
malformed line: RequestFileError names the first MAX_LINE_ERRORS of them. When the server
refuses an item, with_line_numbers turns its requests[i] into the file's line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

MAX_LINE_ERRORS = 20  # a wholly wrong file names its first lines, not thousands
_JSON_KINDS = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


class RequestFileError(ValueError):
    """A request file that cannot be sent; `problems` names its malformed lines."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems


def read_requests(path: Path) -> tuple[list[dict], list[int]]:
    """The JSON objects of path's non-blank lines and their line numbers; RequestFileError
    naming every malformed line (the first MAX_LINE_ERRORS of them)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise RequestFileError(f"cannot read {path}: {exc}") from None
    requests, numbers, problems = [], [], []
    # Not splitlines(): JSON strings may hold U+2028 and other separators it would cut at.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        parsed = parse_line(line)
        if isinstance(parsed, dict):
            requests.append(parsed)
            numbers.append(number)
        else:
            problems.append(f"line {number}: {parsed}")
    if problems:
        more = len(problems) - MAX_LINE_ERRORS
        raise RequestFileError(
            f"{path}: {len(problems)} malformed line(s)"
            + (f" ({more} more not shown)" if more > 0 else "")
            + "; nothing was sent",
            tuple(problems[:MAX_LINE_ERRORS]),
        )
    if not requests:
        raise RequestFileError(f"{path} has no requests (one Workers-AI JSON body per line)")
    return requests, numbers


def parse_line(line: str) -> dict | str:
    """A line's Workers-AI body, or why it cannot be one."""
    try:
        body = json.loads(line)
    except ValueError as exc:
        return f"not valid JSON ({exc})"
    if not isinstance(body, dict):
        kind = _JSON_KINDS.get(type(body), "value")
        return f"not a JSON object (a JSON {kind}); each line is one request body"
    if {"custom_id", "url", "body"} <= body.keys():
        return "an OpenAI batch line; this command takes Workers-AI bodies (prompt or messages)"
    if body.get("stream"):
        return "stream must be absent or false in a batch"
    return body


def with_line_numbers(message: str, numbers: list[int]) -> str:
    """The server's message with each item it names (requests[i] or requests.i, then any
    field path) shown as that item's line of the file."""

    def line(match: re.Match) -> str:
        index = int(match.group(1) or match.group(2))
        if index >= len(numbers):
            return match.group(0)
        field = match.group(3).lstrip(".")
        return f"line {numbers[index]}" + (f", {field}" if field else "")

    return re.sub(r"\brequests(?:\[(\d+)\]|\.(\d+))((?:\.\w+|\[\d+\])*)", line, message)
