"""Grammars for constrained rows, compiled off the step loop and cached.

xgrammar compiles a response format against the tokenizer's vocabulary once (milliseconds for
small schemas, longer for large ones); after that a row's token mask costs microseconds per
step (bench/structured.py). Compilation runs on worker threads (workers.py), so a request whose
grammar is not ready waits outside the scheduler while every other row keeps decoding, as a
request whose adapter is loading does. Results are cached by the format's content and the
tokenizer's, so the same schema compiles once per replica; a failure is cached too, since the
same schema always fails the same way (but not CompilerBusy: a retry may find a thread).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future

from serving.engine.grammar.formats import prepared
from serving.engine.grammar.workers import CompilePool, CompilerBusy, Job
from serving.engine.request import ResponseFormat

JSON_OBJECT = '{"type": "object"}'  # json_object: any JSON object
CACHE_SIZE = 256  # compiled grammars kept (a few hundred KiB each for typical schemas)
# A request still without its grammar after this fails: its schema is too complex to serve
# when its own compile ran this long, else the compiler was too busy (see pending.py).
COMPILE_TIME_LIMIT_S = 10.0
WORKERS = 2  # compiles at once, bar slow ones: they share the cores with the step loop
# A compile running this long stops counting against WORKERS and a queued one starts beside
# it: most compile in milliseconds, so a slow schema delays no one else's past this.
SLOW_S = 1.0
# Threads in all, runaway compiles (past the limit; xgrammar cannot stop one) included: a
# bound on what they take from decoding, with room for others' compiles beside a few.
MAX_THREADS = 6
# One tenant's compiles at once: its runaway schemas hold at most this many of the threads,
# and the others stay free for other tenants' schemas.
PER_TENANT = 2
# U+0000..U+001F, as an EBNF class spells it: \u001f, not \x1f, which xgrammar would read on
# into the class's next characters when they are hex digits ([^\0-\x1fa] is [^\0-\u01fa]).
CONTROLS = "\\0-\\u001f"
_BYTE_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{2}|.)", re.DOTALL)  # an escape: \xHH, or \ and one
_LOCATION = re.compile(r"^\[[\d:]+\] \S+?:\d+: ")  # xgrammar's "[time] file.cc:line: " prefix


class GrammarError(ValueError):
    """The response format cannot be compiled; the message names why, for its caller."""


class GrammarCompiler:
    """submit(format) -> a future of the compiled grammar; one per engine (one tokenizer)."""

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        *,
        time_limit_s: float = COMPILE_TIME_LIMIT_S,
        workers: int = WORKERS,
        max_threads: int = MAX_THREADS,
        slow_s: float = SLOW_S,
        per_tenant: int | None = PER_TENANT,
    ):
        """vocab_size: the model's logits width (it may pad past the tokenizer's ids)."""
        self.vocab_size = vocab_size
        self._tokenizer = tokenizer
        self._pool = CompilePool(workers, max_threads, time_limit_s, slow_s, per_tenant)
        self._cache: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()
        self._compiler = None  # built on the first compile (the vocabulary's trie)
        self._tokenizer_digest = hashlib.sha256(tokenizer.to_json().encode()).hexdigest()
        self.hits = self.misses = 0

    def key(self, fmt: ResponseFormat) -> str:
        """The cache key: the tokenizer's content and the format's."""
        text = f"{self._tokenizer_digest}\0{fmt.kind}\0{fmt.strict}\0{fmt.schema or ''}"
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def time_limit_s(self) -> float:
        """How long a request waits for its grammar, queued or compiling, before it fails."""
        return self._pool.time_limit_s

    @time_limit_s.setter
    def time_limit_s(self, seconds: float) -> None:
        self._pool.time_limit_s = seconds

    def submit(self, fmt: ResponseFormat, tenant: str | None = None) -> Future:
        """The grammar of fmt, compiled or compiling; GrammarError when it cannot compile,
        CompilerBusy when every thread is held by compiles past their limit, OwnerBusy when
        tenant's share is held by its own slow compiles (None: a server of one user)."""
        key = self.key(fmt)
        deadline = time.monotonic() + self.time_limit_s
        with self._lock:
            job = self._cache.get(key)
            if job is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                job.deadline = max(job.deadline, deadline)  # a queued job waits for this one too
                return job.future
            self.misses += 1
        # Outside the lock: the pool's submit fails queued compiles past their deadline, and
        # their callbacks (_forget_busy) take the lock.
        try:
            job = self._pool.submit(lambda: self._compile(fmt), deadline, tenant)
        except CompilerBusy as exc:
            refused: Future = Future()
            refused.set_exception(exc)
            return refused  # not cached: a retry may find a thread
        with self._lock:
            self._cache[key] = job
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        job.future.add_done_callback(lambda f: self._forget_busy(key, job))
        return job.future

    def compile_seconds(self, fmt: ResponseFormat) -> float | None:
        """How long fmt's compile has run; None while it waits for a thread (or is not known),
        0 once done."""
        with self._lock:
            job = self._cache.get(self.key(fmt))
        if job is None or job.started is None:
            return None
        return 0.0 if job.future.done() else time.monotonic() - job.started

    def threads(self) -> int:
        """Compile threads running now, runaway compiles included."""
        return self._pool.threads()

    def compile_now(self, fmt: ResponseFormat):
        """The compiled grammar of fmt, waiting for it (tests and benchmarks)."""
        return self.submit(fmt).result()

    def shutdown(self) -> None:
        self._pool.shutdown()

    def _forget_busy(self, key: str, job: Job) -> None:
        """Drop job from the cache if it never ran: its schema has not failed, only waited."""
        if isinstance(job.future.exception(), CompilerBusy):
            with self._lock:
                if self._cache.get(key) is job:
                    del self._cache[key]

    def _compile(self, fmt: ResponseFormat):
        compiler = self._xgrammar_compiler()
        if fmt.kind == "json_object":
            schema, strict = JSON_OBJECT, False
        elif fmt.kind == "json_schema" and fmt.schema is not None:
            schema, strict = json.dumps(prepared(json.loads(fmt.schema))), fmt.strict
        else:
            raise GrammarError(f"unknown response format {fmt.kind!r}")
        import xgrammar  # (see _make_compiler)

        try:
            # Compact JSON (", " and ": " between items, no other whitespace): a model that
            # may add whitespace anywhere can pad forever, and never close the object.
            grammar = xgrammar.Grammar.from_json_schema(
                schema, any_whitespace=False, strict_mode=strict
            )
            return compiler.compile_grammar(no_raw_controls(reparseable(str(grammar))))
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


def reparseable(ebnf: str) -> str:
    r"""ebnf as xgrammar prints it, with each \xHH escape spelled \u00HH.

    xgrammar prints U+0080..U+00FF as \xHH but reads hex digits after \x for as long as
    they come: a schema's "ïc", printed "\xefc", would be parsed back as U+0EFC.
    """
    return _BYTE_ESCAPE.sub(
        lambda m: "\\u00" + m[1][1:] if m[1][0] == "x" and len(m[1]) == 3 else m[0], ebnf
    )


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
