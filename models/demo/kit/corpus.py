"""The training corpus: the running Python's standard library source, split by file.

It is present offline wherever Python is installed, and it is licensed under the
Python Software Foundation License Version 2, which permits redistribution of
derived works. Test suites, IDLE and vendored third-party code are left out, so
the text is the library's own code and docstrings.
"""

from __future__ import annotations

import ast
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

LICENSE = "Python Software Foundation License Version 2 (PSF-2.0)"
# directories whose code is tests, tools or vendored, not the library itself
_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "ensurepip",
              "turtledemo", "__pycache__", "pydoc_data", "dist-packages"}  # fmt: skip
_VAL_EVERY = 40  # one file in about 40 (by a hash of its path) is held out for validation


@dataclass(frozen=True)
class Corpus:
    """Source files of the standard library, split into train and validation by path."""

    root: Path
    train: tuple[str, ...]
    val: tuple[str, ...]

    @property
    def train_chars(self) -> int:
        return sum(len(t) for t in self.train)


def stdlib_root() -> Path:
    """Where the running interpreter's pure-Python standard library lives."""
    return Path(sysconfig.get_paths()["stdlib"])


def load_corpus(root: Path | None = None, max_files: int | None = None) -> Corpus:
    """Every library .py file under root (sorted, so the split is reproducible)."""
    root = root or stdlib_root()
    paths = sorted(
        p for p in root.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(root).parts)
    )
    if max_files is not None:
        paths = paths[:: max(len(paths) // max_files, 1)][:max_files]  # spread over the library
    train: list[str] = []
    val: list[str] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        rel = path.relative_to(root).as_posix()
        (val if zlib.crc32(rel.encode()) % _VAL_EVERY == 0 else train).append(text)
    if not val and len(train) > 1:  # a small sample may miss every held-out file
        val.append(train.pop())
    if not train or not val:
        raise RuntimeError(f"no usable Python source under {root}")
    return Corpus(root, tuple(train), tuple(val))


def chat_pairs(texts: tuple[str, ...], max_source_chars: int = 900) -> list[tuple[str, str]]:
    """(docstring summary, function source) for each short documented function.

    These teach the chat template: the user asks in words, the assistant answers in code.
    """
    pairs: list[tuple[str, str]] = []
    for text in texts:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        lines = text.split("\n")  # once per file: ast.get_source_segment re-splits per call
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if node.decorator_list or node.end_lineno is None:
                continue
            doc = ast.get_docstring(node)
            body = lines[node.lineno - 1 : node.end_lineno]
            source = "\n".join(_dedent(body, node.col_offset))
            if not doc or len(source) > max_source_chars:
                continue
            summary = doc.strip().split("\n\n")[0].strip()
            if 12 <= len(summary) <= 300:
                pairs.append((" ".join(summary.split()), source))
    return pairs


def _dedent(lines: list[str], col: int) -> list[str]:
    """A method's lines moved to column 0."""
    return [line[col:] if line[:col].strip() == "" else line for line in lines]
