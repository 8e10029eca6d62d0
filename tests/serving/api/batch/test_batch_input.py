"""parse_input, the check of an OpenAI batch file at upload: good lines come back in order,
blank lines are skipped but counted, and every bad line is named by its number."""

import json

import pytest

from serving.api.app import LINE_BODIES
from serving.api.batch.input import (
    MAX_CUSTOM_ID,
    MAX_LINE_DEPTH,
    MAX_REPORTED,
    InputLine,
    parse_input,
)
from serving.api.core.errors import ApiError

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TEXT = {"model": "demo", "prompt": "hi"}


def line(custom_id="a", url="/v1/chat/completions", body=None, **extra) -> str:
    body = body if body is not None else (CHAT if url == "/v1/chat/completions" else TEXT)
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra})


def refused(*lines: str, raw: bytes | None = None) -> str:
    with pytest.raises(ApiError) as caught:
        parse_input(raw if raw is not None else "\n".join(lines).encode(), LINE_BODIES)
    assert caught.value.status == 400
    return caught.value.message


def test_good_lines_come_back_in_order_with_their_bodies():
    """Both endpoints' lines parse, each with its line number; blank lines, CRLF endings and
    a byte-order mark are harmless."""
    content = f"\ufeff{line('a')}\r\n\r\n  \n{line('b', '/v1/completions')}\n".encode()
    assert parse_input(content, LINE_BODIES) == [
        InputLine("a", "/v1/chat/completions", CHAT, line=1),
        InputLine("b", "/v1/completions", TEXT, line=4),
    ]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{", "line 2: not JSON"),
        ('"text"', "line 2: not a JSON object"),
        (line("b", extra=1), "line 2: unknown field 'extra'"),
        (line(""), f"line 2: custom_id must be a string of 1-{MAX_CUSTOM_ID} characters"),
        (line("x" * (MAX_CUSTOM_ID + 1)), "line 2: custom_id must be a string"),
        (line(7), "line 2: custom_id must be a string"),
        (line("b", method="GET"), 'line 2: method must be "POST"'),
        (line("b", "/v1/embeddings"), "line 2: url must be one of /v1/chat/completions"),
        (line("b", body=[1]), "line 2: body must be a JSON object"),
        (line("b", body={**CHAT, "stream": True}), "line 2: body.stream is not supported"),
        (line("b", body={"model": "demo"}), "line 2: body: messages"),
        (line("b", "/v1/completions", {"prompt": "x"}), "line 2: body: model"),
        (line("b", body={**CHAT, "n": 2}), "line 2: body: a line asks for one choice"),
        (line("a"), "line 2: custom_id 'a' is used by an earlier line"),
    ],
)
def test_a_bad_line_is_named_by_number(bad, message):
    """Each kind of malformed line is refused with its line number and what is wrong."""
    assert message in refused(line("a"), bad, line("c"))


def test_blank_lines_count_in_line_numbers():
    """Line numbers are the file's, as an editor shows them, blank lines included."""
    assert refused("", line("a"), "", "nope").startswith("line 4: not JSON")


def test_many_bad_lines_are_summarised():
    """At most MAX_REPORTED lines are named, the rest counted."""
    message = refused(*["x"] * (MAX_REPORTED + 3))
    assert message.count("not JSON") == MAX_REPORTED
    assert f"line {MAX_REPORTED}:" in message and f"line {MAX_REPORTED + 1}:" not in message
    assert message.endswith("and 3 more bad lines")


@pytest.mark.parametrize("raw", [b"", b"\n \n\r\n"])
def test_a_file_with_no_requests_is_refused(raw):
    """An empty file, or one of blank lines only, is a 400 of its own."""
    assert refused(raw=raw) == "the batch file has no requests"


def test_bytes_that_are_not_utf8_are_refused_with_their_offset():
    """A file that is not UTF-8 is refused whole, naming the first bad byte's offset."""
    assert refused(raw=line().encode() + b"\n\xff") == (
        f"the file is not UTF-8 text (byte {len(line()) + 1})"
    )


def test_line_separators_inside_json_strings_do_not_cut_a_line():
    """U+2028, U+2029 and U+0085 may stand unescaped in JSON strings; they are no line ends."""
    body = {"model": "demo", "messages": [{"role": "user", "content": "a\u2028b\u2029c\x85d"}]}
    text = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": body},
                      ensure_ascii=False)  # fmt: skip
    (parsed,) = parse_input(text.encode(), LINE_BODIES)
    assert parsed.body == body and parsed.line == 1


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"custom_id": "\\ud800", "method": "POST", "url": "/v1/completions", "body": {}}',
         "line 1: custom_id: the text holds a lone surrogate"),
        ("[" * 100_000, f"line 1: the JSON nests more than {MAX_LINE_DEPTH} levels deep"),
        ('{"custom_id": "x", "body": {"max_tokens": ' + "9" * 5000 + "}}",
         "line 1: a number with more than 4300 digits"),
    ],
)  # fmt: skip
def test_text_no_store_can_hold_is_refused_as_a_bad_line(raw, message):
    with pytest.raises(ApiError) as caught:
        parse_input(raw.encode(), LINE_BODIES)
    assert caught.value.status == 400 and caught.value.message.startswith(message)
    assert "sys." not in caught.value.message


def _nested(levels: int) -> str:
    """A chat line whose ignored body field nests so that the line is levels objects deep,
    written as text (json.dumps itself would recurse past the interpreter's limit)."""
    body = (
        json.dumps(CHAT)[:-1]
        + ', "ignored": '
        + '{"x": ' * (levels - 2)
        + "0"
        + "}" * (levels - 2)
        + "}"
    )
    return f'{{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {body}}}'


@pytest.mark.parametrize("levels", [MAX_LINE_DEPTH + 1, 988])
def test_a_line_nested_past_the_bound_is_refused_at_upload(levels):
    """However deep the interpreter could parse it here, it is refused by a fixed bound, not
    left to fail (or raise a RecursionError) when it is stored or run from a deeper stack."""
    message = refused(_nested(levels))
    assert f"line 1: the JSON nests more than {MAX_LINE_DEPTH} levels deep" in message


def test_a_line_at_the_bound_is_accepted():
    [parsed] = parse_input(_nested(MAX_LINE_DEPTH).encode(), LINE_BODIES)
    assert parsed.body["ignored"]["x"]["x"]
