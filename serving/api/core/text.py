"""Text a request body may carry: Unicode only (JSON may escape a lone surrogate)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field


def unicode(text: str) -> str:
    """text, or ValueError naming the lone surrogate it holds and where."""
    # JSON may escape a lone surrogate ("\ud800"), which no tokenizer, file or log can encode.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"the text holds a lone surrogate (U+{ord(text[exc.start]):04X}) at character "
            f"{exc.start}, which is not Unicode text"
        ) from None
    return text


Text = Annotated[str, AfterValidator(unicode)]  # every string a body may carry


def short_text(characters: int):
    """Text of at most `characters` characters. (Not Field(max_length): on Text it is
    reported as "at most N items", and on str it refuses a lone surrogate without naming it.)"""

    def bounded(text: str) -> str:
        if len(text) > characters:
            raise ValueError(f"at most {characters} characters, not {len(text)}")
        return text

    return Annotated[str, AfterValidator(unicode), AfterValidator(bounded)]


# OpenAI's metadata: up to 16 pairs, keys of at most 64 characters, values of at most 512
Metadata = Annotated[dict[short_text(64), short_text(512)], Field(max_length=16)]


def nesting(value: object, limit: int) -> int:
    """Levels of objects and arrays in value (a parsed JSON value), counted without
    recursion, and only to limit + 1: what lies deeper is not visited."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        )
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= limit:
            stack.extend((child, level + 1) for child in children)
    return deepest
