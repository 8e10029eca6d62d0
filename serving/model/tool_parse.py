"""A model's output read as text and tool calls, in its family's syntax (tool_formats.py).

One reader serves both answers: a stream feeds it each new piece of text and sends what it
yields at once (content, a call's name, fragments of its arguments, as OpenAI streams them),
and a whole answer is the same reader fed once. A call's syntax is matched with room for the
whitespace an unconstrained model may add; output that is no call in the family's syntax is
content. A whole answer whose calls do not parse is all content, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass

import regex

from serving.model.tool_formats import ToolFormat

_NAME = r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*'
_BETWEEN = " \t\r\n;"  # what may stand between calls besides the family's separator


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallOpened:
    index: int
    name: str


@dataclass(frozen=True)
class Arguments:
    index: int
    fragment: str


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's name and its arguments as the JSON text the model wrote."""

    name: str
    arguments: str


class CallReader:
    """feed(text) -> the events that text completes; finish() -> the rest, at the end."""

    def __init__(self, fmt: ToolFormat) -> None:
        # the calls sit in one list (opening ... closing), or each opens on its own
        self._list = bool(fmt.opening)
        opening = fmt.opening if self._list else fmt.head[: fmt.head.index("{")]
        self._head = regex.compile(_spaced(opening) + _NAME)
        self._item = regex.compile(_NAME)  # a list's later calls
        self._next = regex.compile(r"\s*([,\]])")  # after a list's call: another, or the end
        self._tail = regex.compile(_spaced(fmt.end))
        self._trigger = fmt.trigger
        self._buf, self._pos = "", 0
        # text -> head -> args -> tail -> text; in a list, tail -> next -> item -> args ...
        self._state = "text"
        self.calls = 0
        self.failed = False  # a call began and did not parse: the rest is content
        self._depth, self._in_string, self._escaped = 0, False, False

    def feed(self, text: str) -> list:
        self._buf += text
        events: list = []
        while self._step(events):
            pass
        return events

    def finish(self) -> list:
        """The events left at the end: held text is content; an open call failed."""
        events = self.feed("")
        if self._state != "text":  # a call, or a list of them, left open
            self.failed = True
        rest = self._buf[self._pos :]
        self._pos = len(self._buf)
        if (
            rest
            and (self._state == "text" or self.failed)
            and (not self.calls or rest.strip(_BETWEEN))
        ):
            events.append(Content(rest))
        return events

    def _step(self, events: list) -> bool:
        """Move on through the buffer; False when it needs more text."""
        rest = self._buf[self._pos :]
        if self.failed:
            if rest:
                events.append(Content(rest))
                self._pos = len(self._buf)
            return False
        if self._state == "text":
            return self._text(rest, events)
        if self._state == "args":
            return self._arguments(rest, events)
        pattern = {"head": self._head, "item": self._item, "next": self._next,
                   "tail": self._tail}[self._state]  # fmt: skip
        match = pattern.match(rest, partial=True)
        if match is None:
            return self._fail()
        if match.partial:
            return False
        self._pos += match.end()
        if self._state in ("head", "item"):  # the call's name: its arguments come next
            events.append(CallOpened(self.calls, _unescape(match.group(1))))
            self._state, self._depth = "args", 0
        elif self._state == "next":  # another call of the list, or its end
            self._state = "item" if match.group(1) == "," else "text"
        else:  # the call's end
            self._state, self.calls = "next" if self._list else "text", self.calls + 1
        return True

    def _text(self, rest: str, events: list) -> bool:
        if self.calls:  # between calls: the separator and whitespace are no content
            skipped = len(rest) - len(rest.lstrip(_BETWEEN))
            self._pos += skipped
            rest = rest[skipped:]
        at = rest.find(self._trigger)
        if at >= 0:
            if rest[:at]:
                events.append(Content(rest[:at]))
            self._pos += at
            self._state = "head"
            return True
        # hold back what may be the start of a trigger, and (after a call) trailing blanks
        keep = next((k for k in range(min(len(rest), len(self._trigger) - 1), 0, -1)
                     if self._trigger.startswith(rest[-k:])), 0)  # fmt: skip
        out = rest[: len(rest) - keep]
        if self.calls:
            out = out.rstrip(_BETWEEN)
        if out:
            events.append(Content(out))
            self._pos += len(out)
        return False

    def _arguments(self, rest: str, events: list) -> bool:
        """Scan the arguments' JSON object as far as it has come; its end closes the value."""
        if self._depth == 0:  # blanks before the object are no part of it
            self._pos += len(rest) - len(rest.lstrip())
            rest = rest.lstrip()
            if not rest:
                return False
            if rest[0] != "{":
                return self._fail()
        for i in range(len(rest)):
            c = rest[i]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    events.append(Arguments(self.calls, rest[: i + 1]))
                    self._pos += i + 1
                    self._state = "tail"
                    return True
        if rest:
            events.append(Arguments(self.calls, rest))
        self._pos += len(rest)
        return False

    def _fail(self) -> bool:
        self.failed = True
        return True


def parse_calls(fmt: ToolFormat, text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole answer; all of it content when a call does not parse."""
    reader = CallReader(fmt)
    events = reader.feed(text) + reader.finish()
    if reader.failed or not reader.calls:
        return text, []
    names: list[str] = []
    arguments: list[str] = []
    content = ""
    for event in events:
        if isinstance(event, Content):
            content += event.text
        elif isinstance(event, CallOpened):
            names.append(event.name)
            arguments.append("")
        else:
            arguments[event.index] += event.fragment
    calls = [ToolCall(n, a) for n, a in zip(names, arguments, strict=True)]
    return content.strip() or None, calls


def _spaced(text: str) -> str:
    """A pattern of text's words with any whitespace before and between them."""
    return "".join(r"\s*" + regex.escape(word) for word in text.split())


def _unescape(name: str) -> str:
    return regex.sub(r"\\(.)", r"\1", name)
