"""Grammars for constrained rows, compiled off the step loop and cached.

xgrammar compiles a response format against the tokenizer's vocabulary once (milliseconds for
small schemas, longer for large ones); after that a row's token mask costs microseconds per
step (bench/structured.py). A schema whose estimated cost (cost.py) is over budget is refused
before it compiles; the rest compile in worker processes (workers.py) that are killed when a
compile runs past the time limit or no request waits for it any more. A request whose grammar
is not ready waits outside the scheduler while every other row keeps decoding, as a request
whose adapter is loading does. Results are cached by the format's content and the
tokenizer's, so the same schema compiles once per replica; a failure is cached too, since the
same schema always fails the same way (but not CompilerBusy: a retry may find a worker).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future

from serving.engine.grammar.cost import cost_problem
from serving.engine.grammar.ebnf import no_raw_controls, reparseable
from serving.engine.grammar.formats import prepared, tag_schemas
from serving.engine.grammar.process import CompileProcess
from serving.engine.grammar.workers import CompilePool, CompilerBusy, GrammarError, Job
from serving.engine.request import ResponseFormat

__all__ = ["GrammarCompiler", "GrammarError", "no_raw_controls", "reparseable"]
JSON_OBJECT = '{"type": "object"}'  # json_object: any JSON object
CACHE_SIZE = 256  # compiled grammars kept (a few hundred KiB each for typical schemas)
# A request still without its grammar after this fails: its schema is too complex to serve
# when its own compile ran this long (and the compile is stopped), else the compiler was
# too busy (see pending.py).
COMPILE_TIME_LIMIT_S = 10.0
# Compile processes (each its vocabulary's tables, tens of MiB): they share the cores with
# the step loop, at a lower priority.
WORKERS = 3
# One tenant's compiles at once: the other workers stay free for other tenants' schemas.
PER_TENANT = 2


class GrammarCompiler:
    """submit(format) -> a future of the compiled grammar; one per engine (one tokenizer)."""

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        *,
        time_limit_s: float = COMPILE_TIME_LIMIT_S,
        workers: int = WORKERS,
        per_tenant: int | None = PER_TENANT,
    ):
        """vocab_size: the model's logits width (it may pad past the tokenizer's ids)."""
        self.vocab_size = vocab_size
        self._tokenizer = tokenizer
        self._pool = CompilePool(self._start_process, self._read, workers, time_limit_s,
                                 per_tenant)  # fmt: skip
        self._cache: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()
        self._info = None  # xgrammar's TokenizerInfo, built with the first process
        self._tokenizer_digest = hashlib.sha256(tokenizer.to_json().encode()).hexdigest()

    def key(self, fmt: ResponseFormat) -> str:
        """The cache key: the tokenizer's content and the format's."""
        text = f"{self._tokenizer_digest}\0{fmt.kind}\0{fmt.strict}\0{fmt.schema or ''}"
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def time_limit_s(self) -> float:
        """How long a compile may run before it is stopped and its requests fail."""
        return self._pool.time_limit_s

    @time_limit_s.setter
    def time_limit_s(self, seconds: float) -> None:
        self._pool.time_limit_s = seconds

    def start(self) -> None:
        """Start the compile processes now (on threads of their own), not on a first schema."""
        self._pool.start()

    def submit(self, fmt: ResponseFormat, tenant: str | None = None) -> Future:
        """The grammar of fmt, compiled or compiling; GrammarError when it cannot compile
        (or would cost too much to), CompilerBusy when the engine shut down or no worker
        took it in time, OwnerBusy when tenant's share is full (None: a server of one user)."""
        key = self.key(fmt)
        deadline = time.monotonic() + self.time_limit_s
        with self._lock:
            job = self._cache.get(key)
            if job is not None:
                self._cache.move_to_end(key)
                job.deadline = max(job.deadline, deadline)  # a queued job waits for this one too
                job.waiters += 1
                return job.future
        try:
            schema, strict = self._schema(fmt)
            job = self._pool.submit(schema, strict, deadline, tenant, fmt.kind)
        except (GrammarError, CompilerBusy) as exc:
            refused: Future = Future()
            refused.set_exception(exc)
            if isinstance(exc, GrammarError):  # the same schema always costs the same
                self._put(key, Job(fmt.schema or "", fmt.strict, deadline, future=refused))
            return refused  # a busy refusal is not cached: a retry may find a worker
        self._put(key, job)
        job.future.add_done_callback(lambda f: self._forget_busy(key, job))
        return job.future

    def num_cached(self) -> int:
        """Formats cached: compiled, compiling or refused (at most CACHE_SIZE)."""
        return len(self._cache)

    def release(self, key: str) -> None:
        """A request waiting on the compile of key (a format's key()) went away: with none
        left, the compile stops."""
        with self._lock:
            job = self._cache.get(key)
        if job is not None and not job.future.done():
            self._pool.release(job)

    def compile_seconds(self, key: str) -> float | None:
        """How long the compile of key (a format's key()) has run; None while it waits for a
        worker (or is not known), 0 once done."""
        with self._lock:
            job = self._cache.get(key)
        if job is None or job.started is None:
            return None
        return 0.0 if job.future.done() else time.monotonic() - job.started

    def threads(self) -> int:
        """Compiles running now."""
        return self._pool.threads()

    def pids(self) -> list[int]:
        """The compile processes' ids (for tests)."""
        return self._pool.pids()

    def compile_now(self, fmt: ResponseFormat):
        """The compiled grammar of fmt, waiting for it (tests and benchmarks)."""
        return self.submit(fmt).result()

    def shutdown(self) -> None:
        self._pool.shutdown()

    def _put(self, key: str, job: Job) -> None:
        """Cache job under key, the least recently used entries beyond CACHE_SIZE dropped."""
        with self._lock:
            self._cache[key] = job
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)

    def _forget_busy(self, key: str, job: Job) -> None:
        """Drop job from the cache if it never finished: its schema has not failed, only waited."""
        if isinstance(job.future.exception(), CompilerBusy):
            with self._lock:
                if self._cache.get(key) is job:
                    del self._cache[key]

    def _schema(self, fmt: ResponseFormat) -> tuple[str, bool]:
        """(the schema as xgrammar is to read it, strict); GrammarError if it costs too much."""
        if fmt.kind == "json_object":
            return JSON_OBJECT, False
        if fmt.kind not in ("json_schema", "structural_tag") or fmt.schema is None:
            raise GrammarError(f"unknown response format {fmt.kind!r}")
        if fmt.kind == "structural_tag":
            tag = json.loads(fmt.schema)
            for node in tag_schemas(tag):
                node["json_schema"] = self._checked(node["json_schema"], node.get("strict", False))
            return json.dumps(tag), False
        return json.dumps(self._checked(json.loads(fmt.schema), fmt.strict)), fmt.strict

    @staticmethod
    def _checked(schema: object, strict: bool) -> object:
        """schema as xgrammar is to read it; GrammarError if it costs too much (the API
        refuses these first; a direct caller too)."""
        schema = prepared(schema)
        problem = cost_problem(schema, strict)
        if problem:
            raise GrammarError(problem)
        return schema

    def _tokenizer_info(self):
        with self._lock:
            if self._info is None:
                self._info = _make_tokenizer_info(self._tokenizer, self.vocab_size)
            return self._info

    def _start_process(self) -> CompileProcess:
        return CompileProcess(self._tokenizer_info().serialize_json())

    def _read(self, text: str):
        """A compiled grammar, from a compile process's answer."""
        import xgrammar  # (see _make_tokenizer_info)

        return xgrammar.CompiledGrammar.deserialize_json(text, self._tokenizer_info())


def _make_tokenizer_info(tokenizer, vocab_size: int):
    """xgrammar's view of tokenizer's vocabulary, padded to the logits' vocab_size."""
    import xgrammar  # imported here: it pulls transformers in, and only grammars need it

    vocab = tokenizer.encoded_vocab()
    stops = set(tokenizer.eos_token_ids)
    # Special tokens other than the stops (and the markers that spell a tool call) never
    # appear in text: an empty string is one the grammar never allows (xgrammar treats it
    # as special).
    for i in tokenizer.special_token_ids() - stops - tokenizer.marker_ids:
        vocab[i] = ""
    meta = xgrammar.TokenizerInfo._detect_metadata_from_hf(tokenizer.to_json())
    return xgrammar.TokenizerInfo(
        vocab,
        meta["vocab_type"],
        vocab_size=max(vocab_size, len(vocab)),
        stop_token_ids=sorted(stops),
        add_prefix_space=meta["add_prefix_space"],
    )
