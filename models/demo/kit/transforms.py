"""The three adapters' transformations, and the measures that recognise each one.

Each is visible at a glance in generated text and learnable by a rank-8 LoRA in
minutes on a CPU: upper case, every line turned into a comment, and rot13.
"""

from __future__ import annotations

import codecs
import keyword
import re
from collections.abc import Callable
from dataclasses import dataclass

_WORD = re.compile(r"[A-Za-z]{3,}")


def upper(text: str) -> str:
    return text.upper()


def comment(text: str) -> str:
    """Every line of code becomes a comment: `x = 1` -> `# x = 1`."""
    return "\n".join(f"# {line}" if line.strip() else line for line in text.split("\n"))


def rot13(text: str) -> str:
    return codecs.encode(text, "rot13")


def upper_share(text: str) -> float:
    """Share of letters that are upper case."""
    letters = [c for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / max(len(letters), 1)


def comment_share(text: str) -> float:
    """Share of non-blank lines that start with '#'."""
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    return sum(line.startswith("#") for line in lines) / max(len(lines), 1)


def rot13_share(text: str, known: frozenset[str]) -> float:
    """Share of words that are known words once rot13 is undone (case-insensitive)."""
    words = _WORD.findall(text)
    return sum(rot13(w).lower() in known for w in words) / max(len(words), 1)


def known_words(texts: tuple[str, ...], min_count: int = 20) -> frozenset[str]:
    """Lower-cased words of 3+ letters seen at least min_count times, plus Python's keywords."""
    counts: dict[str, int] = {}
    for text in texts:
        for w in _WORD.findall(text):
            counts[w.lower()] = counts.get(w.lower(), 0) + 1
    common = {w for w, n in counts.items() if n >= min_count}
    # a word that is itself a known word after rot13 would count on both sides
    return frozenset(w for w in common | set(keyword.kwlist) if rot13(w) not in common)


@dataclass(frozen=True)
class Transform:
    """An adapter's name, what it does to text, and how to measure that it did."""

    name: str
    summary: str
    apply: Callable[[str], str]
    measure: str  # which measure in `measure_effect`
    threshold: float  # the adapter's output must reach this share


TRANSFORMS = (
    Transform("upper", "answers in UPPER CASE", upper, "upper_share", 0.8),
    Transform("comment", "turns every line into a # comment", comment, "comment_share", 0.7),
    Transform("rot13", "answers in rot13", rot13, "rot13_share", 0.3),
)


def measure_effect(measure: str, text: str, known: frozenset[str]) -> float:
    """The share a transform's measure gives text."""
    if measure == "upper_share":
        return upper_share(text)
    if measure == "comment_share":
        return comment_share(text)
    return rot13_share(text, known)
