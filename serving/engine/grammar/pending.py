"""Constrained requests whose grammar is still compiling: held outside the scheduler.

A request with a response format enters the scheduler only once its grammar is compiled, so
its wait costs no other row anything (as a request whose adapter loads waits in the slab's
queue). A compile that fails, or runs past the time limit (and is stopped), fails that
request alone, as the caller's own fault: its schema is what cannot be served. The limit
bounds a request's wait for a compile worker too, so no request waits on other schemas'
compiles past it: one still queued then fails as the engine's fault (the compiler is busy),
not the caller's, since its schema never ran; but when the tenant's own schemas fill its
share of the compiler, the wait is its own doing (a 429). A request that goes away, or gives
up, no longer waits on its compile: one no request waits for is stopped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from serving.engine.grammar.compiler import GrammarCompiler, GrammarError
from serving.engine.grammar.matcher import RowGrammar
from serving.engine.grammar.workers import CompilerBusy, OwnerBusy

logger = logging.getLogger(__name__)


class PendingGrammars:
    """Tracked requests (see engine.tracked) waiting on their grammar's compile."""

    def __init__(self, tokenizer, vocab_size: int, wake: Callable[[], None]):
        self._tokenizer, self._vocab_size, self._wake = tokenizer, vocab_size, wake
        self._compiler: GrammarCompiler | None = None  # made with the first response format
        # request id -> (t, future, when it gives up waiting, its format's key): the key is
        # hashed once, not on every step (a schema may be 32 KiB, and many may wait)
        self._waiting: dict[str, tuple[object, object, float, str]] = {}

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:
            self._compiler = GrammarCompiler(self._tokenizer, self._vocab_size)
        return self._compiler

    def num_cached(self) -> int:
        """Formats in the compile cache (none before the first response format)."""
        return self._compiler.num_cached() if self._compiler is not None else 0

    def start(self) -> None:
        """Start the compile processes now, off the step loop, not with a first schema."""
        self.compiler.start()

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def add(self, t) -> None:
        """Start (or join) the compile of t's response format; ready() hands t back."""
        compiler = self.compiler
        deadline = time.monotonic() + compiler.time_limit_s
        request = t.seq.request
        future = compiler.submit(request.response_format, request.tenant)
        key = compiler.key(request.response_format)
        self._waiting[t.seq.request.request_id] = (t, future, deadline, key)
        future.add_done_callback(lambda _: self._wake())

    def drop(self, request_id: str) -> None:
        waiting = self._waiting.pop(request_id, None)
        if waiting is not None and not waiting[1].done():
            self.compiler.release(waiting[3])

    def ready(self) -> tuple[list, list[tuple[object, str, str]]]:
        """(requests whose grammar is set and may be scheduled, [(request, why it failed,
        whose fault: "own" (its schema), "busy" (the compiler, now), "limited" (its tenant's
        share of the compiler, now) or "engine")])."""
        done, failed = [], []
        compiler = self.compiler
        limit = compiler.time_limit_s
        for request_id, (t, future, deadline, key) in list(self._waiting.items()):
            if not future.done():
                ran = compiler.compile_seconds(key)
                if ran is not None and ran > limit:
                    self.drop(request_id)
                    failed.append((t, f"the response format's schema did not compile within "
                                      f"{limit:g} s; simplify it", "own"))  # fmt: skip
                elif ran is None and time.monotonic() > deadline:
                    self.drop(request_id)
                    failed.append((t, f"the response format's schema waited {limit:g} s for "
                                      f"the schema compiler, busy with slower schemas; retry "
                                      f"later", "busy"))  # fmt: skip
                continue
            del self._waiting[request_id]
            try:
                t.grammar = RowGrammar(future.result())
            except GrammarError as exc:
                failed.append((t, str(exc), "own"))
            except OwnerBusy as exc:
                failed.append((t, str(exc), "limited"))
            except CompilerBusy as exc:
                failed.append((t, str(exc), "busy"))
            except Exception as exc:  # the compiler's own fault, not the schema's
                logger.exception("compiling a response format failed")
                failed.append((t, f"internal error: {type(exc).__name__}", "engine"))
            else:
                done.append(t)
        return done, failed

    def shutdown(self) -> None:
        if self._compiler is not None:
            self._compiler.shutdown()
