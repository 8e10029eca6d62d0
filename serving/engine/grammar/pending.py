"""Constrained requests whose grammar is still compiling: held outside the scheduler.

A request with a response format enters the scheduler only once its grammar is compiled, so
its wait costs no other row anything (as a request whose adapter loads waits in the slab's
queue). A compile that fails, or runs past its time limit, fails that request alone, as
the caller's own fault: its schema is what cannot be served. The limit counts from when the
compile starts, so a request queued behind someone else's slow compile is not blamed for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from serving.engine.grammar.compiler import GrammarCompiler, GrammarError
from serving.engine.grammar.matcher import RowGrammar

logger = logging.getLogger(__name__)


class PendingGrammars:
    """Tracked requests (see engine.tracked) waiting on their grammar's compile."""

    def __init__(self, tokenizer, vocab_size: int, wake: Callable[[], None]):
        self._tokenizer, self._vocab_size, self._wake = tokenizer, vocab_size, wake
        self._compiler: GrammarCompiler | None = None  # made with the first response format
        self._waiting: dict[str, tuple[object, object]] = {}  # request id -> (t, future)

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:
            self._compiler = GrammarCompiler(self._tokenizer, self._vocab_size)
        return self._compiler

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def add(self, t) -> None:
        """Start (or join) the compile of t's response format; ready() hands t back."""
        future = self.compiler.submit(t.seq.request.response_format)
        self._waiting[t.seq.request.request_id] = (t, future)
        future.add_done_callback(lambda _: self._wake())

    def drop(self, request_id: str) -> None:
        self._waiting.pop(request_id, None)

    def ready(self) -> tuple[list, list[tuple[object, str, bool]]]:
        """(requests whose grammar is set and may be scheduled, [(request, why it failed,
        whether its own schema is the cause)])."""
        done, failed = [], []
        compiler = self.compiler
        limit = compiler.time_limit_s
        for request_id, (t, future) in list(self._waiting.items()):
            if not future.done():
                if compiler.compile_seconds(t.seq.request.response_format) > limit:
                    del self._waiting[request_id]
                    failed.append((t, f"the response format's schema did not compile within "
                                      f"{limit:g} s; simplify it", True))  # fmt: skip
                continue
            del self._waiting[request_id]
            try:
                t.grammar = RowGrammar(future.result())
            except GrammarError as exc:
                failed.append((t, str(exc), True))
            except Exception as exc:  # the compiler's own fault, not the schema's
                logger.exception("compiling a response format failed")
                failed.append((t, f"internal error: {type(exc).__name__}", False))
            else:
                done.append(t)
        return done, failed

    def shutdown(self) -> None:
        if self._compiler is not None:
            self._compiler.shutdown()
