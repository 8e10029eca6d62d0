"""Text a request body may carry: Unicode only (JSON may escape a lone surrogate)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator


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
