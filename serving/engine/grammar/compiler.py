"""Grammars for constrained rows, compiled off the step loop and cached.

xgrammar compiles a response format against the tokenizer's vocabulary once (milliseconds for
small schemas, longer for large ones); after that a row's token mask costs microseconds per
step (bench/structured.py). Compilation runs on worker threads, so a request whose grammar is
not ready waits outside the scheduler while every other row keeps decoding, as a request
whose adapter is loading does. Results are cached by the format's content and the
tokenizer's, so the same schema compiles once per replica; a failure is cached too, since the
same schema always fails the same way.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from serving.engine.request import ResponseFormat

JSON_OBJECT = '{"type": "object"}'  # json_object: any JSON object
CACHE_SIZE = 256  # compiled grammars kept (a few hundred KiB each for typical schemas)
# A compile still running after this fails its request: its schema is too complex to serve.
COMPILE_TIME_LIMIT_S = 10.0
WORKERS = 2  # one pathological schema must not hold up every other tenant's compiles
CONTROLS = "\\0-\\x1f"  # U+0000..U+001F, as an EBNF class spells it
_LOCATION = re.compile(r"^\[[\d:]+\] \S+?:\d+: ")  # xgrammar's "[time] file.cc:line: " prefix


class GrammarError(ValueError):
    """The response format cannot be compiled; the message names why, for its caller."""


class GrammarCompiler:
    """submit(format) -> a future of the compiled grammar; one per engine (one tokenizer)."""

    def __init__(self, tokenizer, vocab_size: int, *, time_limit_s: float = COMPILE_TIME_LIMIT_S):
        """vocab_size: the model's logits width (it may pad past the tokenizer's ids)."""
        self.vocab_size, self.time_limit_s = vocab_size, time_limit_s
        self._tokenizer = tokenizer
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="grammar-compile")
        self._cache: OrderedDict[str, Future] = OrderedDict()
        self._lock = threading.Lock()
        self._compiler = None  # built on the first compile (the vocabulary's trie)
        self._started: dict[str, float] = {}  # key -> when its compile began (running ones)
        self._tokenizer_digest = hashlib.sha256(tokenizer.to_json().encode()).hexdigest()
        self.hits = self.misses = 0

    def key(self, fmt: ResponseFormat) -> str:
        """The cache key: the tokenizer's content and the format's."""
        text = f"{self._tokenizer_digest}\0{fmt.kind}\0{fmt.strict}\0{fmt.schema or ''}"
        return hashlib.sha256(text.encode()).hexdigest()

    def submit(self, fmt: ResponseFormat) -> Future:
        """The grammar of fmt, compiled or compiling; GrammarError when it cannot compile."""
        key = self.key(fmt)
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return future
            self.misses += 1
            future = self._pool.submit(self._timed, key, fmt)
            self._cache[key] = future
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return future

    def compile_seconds(self, fmt: ResponseFormat) -> float:
        """How long fmt's compile has run (0 while it waits for a worker, or once done)."""
        start = self._started.get(self.key(fmt))
        return 0.0 if start is None else time.monotonic() - start

    def compile_now(self, fmt: ResponseFormat):
        """The compiled grammar of fmt, waiting for it (tests and benchmarks)."""
        return self.submit(fmt).result()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _timed(self, key: str, fmt: ResponseFormat):
        # Timed from here, not from submit: a compile queued behind another tenant's slow one
        # has not used any of its time yet.
        self._started[key] = time.monotonic()
        try:
            return self._compile(fmt)
        finally:
            self._started.pop(key, None)

    def _compile(self, fmt: ResponseFormat):
        compiler = self._xgrammar_compiler()
        if fmt.kind == "json_object":
            schema, strict = JSON_OBJECT, False
        elif fmt.kind == "json_schema" and fmt.schema is not None:
            schema, strict = fmt.schema, fmt.strict
        else:
            raise GrammarError(f"unknown response format {fmt.kind!r}")
        import xgrammar  # (see _make_compiler)

        try:
            # Compact JSON (", " and ": " between items, no other whitespace): a model that
            # may add whitespace anywhere can pad forever, and never close the object.
            grammar = xgrammar.Grammar.from_json_schema(
                schema, any_whitespace=False, strict_mode=strict
            )
            return compiler.compile_grammar(no_raw_controls(str(grammar)))
        except (RuntimeError, ValueError) as exc:  # xgrammar names the construct it refuses
            first = (str(exc).strip().splitlines() or ["unknown error"])[0]
            raise GrammarError(
                f"the schema cannot be compiled: {_LOCATION.sub('', first)}"
            ) from None

    def _xgrammar_compiler(self):
        with self._lock:
            if self._compiler is None:
                self._compiler = _make_compiler(self._tokenizer, self.vocab_size)
            return self._compiler


def no_raw_controls(ebnf: str) -> str:
    """ebnf with U+0000..U+001F taken out of every negated character class.

    JSON strings may hold control characters only escaped, but xgrammar's rules for strings
    with a length bound or a pattern are negated classes such as [^"\\\r\n], which let a raw
    one through (and a strict parser then refuses the output). Negated classes only ever
    stand for string characters in a JSON grammar; quoted literals are left as they are.
    """
    out, i, quoted, in_class = [], 0, False, False
    while i < len(ebnf):
        c = ebnf[i]
        if c == "\\":  # an escape, in a literal or a class: copy it whole
            out.append(ebnf[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == '"':
            quoted = not quoted
        elif not quoted and c == "[":
            in_class = True
            if ebnf.startswith("[^", i) and not ebnf.startswith(CONTROLS, i + 2):
                out.append("[^" + CONTROLS)
                i += 2
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _make_compiler(tokenizer, vocab_size: int):
    """An xgrammar compiler over tokenizer's vocabulary, padded to the logits' vocab_size."""
    import xgrammar  # imported here: it pulls transformers in, and only grammars need it

    vocab = tokenizer.encoded_vocab()
    stops = set(tokenizer.eos_token_ids)
    # Special tokens other than the stops never appear in text: an empty string is one the
    # grammar never allows (xgrammar treats it as special).
    for i in tokenizer.special_token_ids() - stops:
        vocab[i] = ""
    meta = xgrammar.TokenizerInfo._detect_metadata_from_hf(tokenizer.to_json())
    info = xgrammar.TokenizerInfo(
        vocab,
        meta["vocab_type"],
        vocab_size=max(vocab_size, len(vocab)),
        stop_token_ids=sorted(stops),
        add_prefix_space=meta["add_prefix_space"],
    )
    return xgrammar.GrammarCompiler(info, max_threads=1)
