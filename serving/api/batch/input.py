"""OpenAI batch input files: JSONL lines of {custom_id, method, url, body}, checked line by line.

A file for purpose `batch` is checked when it is uploaded, so a typo is reported at once,
naming each bad line (at most MAX_REPORTED), rather than as failed items hours later. Each
body is validated as its route would validate it; what only running can tell (an unknown
adapter, a prompt too long once tokenized) fails that item alone.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from serving.api.core.body_fields import MAX_BATCH_ITEMS
from serving.api.core.errors import ApiError, describe_validation
from serving.api.core.text import nesting, unicode

# url -> the body model its route validates with, each with num_choices() (app.py's LINE_BODIES)
LineBodies = Mapping[str, type[BaseModel]]
MAX_REPORTED = 10
MAX_CUSTOM_ID = 512
# Storing, reading back and running a line recurse through it, each from a deeper stack than
# the upload's parse: a fixed bound keeps what passes here within all of them. A schema
# nests at most 32 levels (schema_rules), inside a line's 5 of wrapping.
MAX_LINE_DEPTH = 64


@dataclass(frozen=True)
class InputLine:
    custom_id: str
    url: str
    body: dict
    line: int = 0  # its line number in the file, from 1


def parse_input(content: bytes, bodies: LineBodies) -> list[InputLine]:
    """The requests of a batch input file, each body checked by bodies[url]; 400 naming each
    bad line, or an empty file."""
    try:
        text = content.decode("utf-8-sig")  # a byte-order mark, as some editors write, is no line
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the file is not UTF-8 text (byte {exc.start})") from None
    lines, problems, seen = [], [], set()
    # Not splitlines(): it also splits at U+2028 and other separators that JSON strings may
    # hold unescaped, so a valid file would be cut inside its lines.
    for number, raw in enumerate(text.split("\n"), start=1):
        raw = raw.removesuffix("\r")
        if not raw.strip():
            continue
        try:
            line = dataclasses.replace(_line(raw, bodies), line=number)
            if line.custom_id in seen:
                raise ValueError(f"custom_id {line.custom_id!r} is used by an earlier line")
            seen.add(line.custom_id)
            lines.append(line)
        except ValueError as exc:
            problems.append(f"line {number}: {exc}")
    if problems:
        more = len(problems) - MAX_REPORTED
        tail = [f"and {more} more bad lines"] if more > 0 else []
        raise ApiError(400, "; ".join(problems[:MAX_REPORTED] + tail))
    if not lines:
        raise ApiError(400, "the batch file has no requests")
    if len(lines) > MAX_BATCH_ITEMS:
        raise ApiError(400, f"the batch file has {len(lines)} requests, more than the "
                            f"{MAX_BATCH_ITEMS} one batch may hold; split it")  # fmt: skip
    return lines


def _line(raw: str, bodies: LineBodies) -> InputLine:
    too_deep = f"the JSON nests more than {MAX_LINE_DEPTH} levels deep"
    try:
        data = json.loads(raw)
    except RecursionError:  # deeper still than the bound below
        raise ValueError(too_deep) from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # int()'s, which names a sys knob
            raise ValueError(
                f"a number with more than {sys.get_int_max_str_digits()} digits"
            ) from None
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if nesting(data, MAX_LINE_DEPTH) > MAX_LINE_DEPTH:  # before anything recurses into it
        raise ValueError(too_deep)
    unknown = set(data) - {"custom_id", "method", "url", "body"}
    if unknown:
        raise ValueError(f"unknown field {sorted(unknown)[0]!r}")
    custom_id, url, body = data.get("custom_id"), data.get("url"), data.get("body")
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID:
        raise ValueError(f"custom_id must be a string of 1-{MAX_CUSTOM_ID} characters")
    try:
        unicode(custom_id)  # a lone surrogate could be stored nowhere
    except ValueError as exc:
        raise ValueError(f"custom_id: {exc}") from None
    if data.get("method") != "POST":
        raise ValueError('method must be "POST"')
    if url not in bodies:
        raise ValueError(f"url must be one of {', '.join(bodies)}, got {url!r}")
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    if body.get("stream"):
        raise ValueError("body.stream is not supported in a batch")
    try:
        parsed = bodies[url].model_validate(body)
    except RecursionError:
        raise ValueError("body: the JSON nests too deeply") from None
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        raise ValueError(f"body: {describe_validation(RequestValidationError(errors))}") from None
    if parsed.num_choices() > 1:  # its answer is metered as one record
        raise ValueError("body: a line asks for one choice (one prompt, n 1); give each "
                         "choice a line of its own")  # fmt: skip
    return InputLine(custom_id, url, body)
