"""Grammar compile threads: a compile that runs past its limit (xgrammar cannot stop one)
holds up no other schema's compile past the limit, threads stay bounded, and when every
thread is held by such compiles a new one is refused at once, as the engine's fault.

Compiles here are functions that wait on an event: a runaway compile without its minute.
"""

import dataclasses
import json
import threading
import time
from types import SimpleNamespace

import jsonschema
import pytest

from serving.engine.grammar.compiler import GrammarCompiler
from serving.engine.grammar.workers import CompilePool, CompilerBusy, OwnerBusy
from tests.serving.engine.test_structured import (
    CHOICES,
    ORDER,
    PERSON,
    Run,
    fmt,
    hold_compile,
    params,
    req,
)
from tests.serving.engine.world import FIELDS, build_world


def held(gate: threading.Event, ran: list | None = None):
    """A compile that runs until gate is set (noting that it began in ran)."""

    def compile_():
        if ran is not None:
            ran.append(1)
        assert gate.wait(30)
        return "held"

    return compile_


def soon(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


def test_a_quick_compile_starts_beside_slow_ones():
    pool = CompilePool(workers=1, max_threads=3, time_limit_s=5.0, slow_s=0.05)
    gate = threading.Event()
    try:
        slow = [pool.submit(held(gate), soon()) for _ in range(2)]
        began = time.monotonic()
        quick = pool.submit(lambda: "quick", soon())
        assert quick.future.result(timeout=2.5) == "quick"
        # It waited for the worker only until the slow compile in it was slow_s old, not for
        # either slow one to end (they never do here) nor for the 5 s limit.
        assert time.monotonic() - began < 2.5
        assert not any(job.future.done() for job in slow)
    finally:
        gate.set()


def test_threads_stay_bounded_and_a_stuck_pool_refuses_at_once():
    pool = CompilePool(workers=1, max_threads=2, time_limit_s=0.2, slow_s=0.01)
    gate, ran = threading.Event(), []
    try:
        for _ in range(2):
            pool.submit(held(gate, ran), soon())
        queued = pool.submit(held(gate, ran), soon())
        deadline = soon(2.0)  # the second starts once the first is slow_s old
        while len(ran) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert pool.threads() == 2 and len(ran) == 2  # the third waits: no third thread
        # Both threads pass the limit: nothing the queued compile waits for is due, so it is
        # refused then and there, not left to wait out its own deadline.
        with pytest.raises(CompilerBusy, match=r"overran the 0\.2 s time limit"):
            queued.future.result(timeout=1.0)
        with pytest.raises(CompilerBusy, match="all 2 of its threads"):
            pool.submit(lambda: "refused", soon())
        assert len(ran) == 2
        gate.set()
        while pool.threads():  # the runaway compiles end: their threads are free again
            time.sleep(0.01)
        assert pool.submit(lambda: "again", soon()).future.result(timeout=2.0) == "again"
    finally:
        gate.set()


def test_a_compile_no_request_waits_for_never_runs():
    pool = CompilePool(workers=1, max_threads=1, time_limit_s=10.0, slow_s=10.0)
    gate, ran = threading.Event(), []
    try:
        pool.submit(held(gate), soon())
        late = pool.submit(lambda: ran.append(1), time.monotonic() + 0.05)
        time.sleep(0.1)
        gate.set()
        with pytest.raises(CompilerBusy, match="no request waits"):
            late.future.result(timeout=2.0)
        assert not ran
    finally:
        gate.set()


def test_one_owners_slow_compiles_leave_the_other_threads_to_others():
    """An owner runs at most per_owner compiles at once: its next waits for them, and is
    refused once they are slow (its own doing), while another owner's compile runs at once
    and unowned compiles (a server of one user) are not bounded."""
    pool = CompilePool(workers=2, max_threads=4, time_limit_s=5.0, slow_s=0.05, per_owner=1)
    gate, ran = threading.Event(), []
    try:
        pool.submit(held(gate, ran), soon(), "acme")
        waiting = pool.submit(held(gate, ran), soon(), "acme")  # a worker is free: acme's is not
        assert not waiting.future.done() and len(ran) == 1
        with pytest.raises(OwnerBusy, match="1 of this tenant's earlier schemas"):
            waiting.future.result(timeout=2.0)  # refused once acme's first turned slow
        with pytest.raises(OwnerBusy):
            pool.submit(lambda: "refused", soon(), "acme")
        other = pool.submit(lambda: "served", soon(), "globex")
        assert other.future.result(timeout=2.0) == "served"
        for _ in range(2):
            pool.submit(held(gate, ran), soon(), None)
        deadline = soon(2.0)
        while len(ran) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(ran) == 3 and pool.threads() == 3  # acme's one and both unowned
        gate.set()
        while pool.threads():
            time.sleep(0.01)
        assert pool.submit(lambda: "again", soon(), "acme").future.result(timeout=2.0) == "again"
    finally:
        gate.set()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("workers"))


def compiler_for(world, engine, **bounds) -> GrammarCompiler:
    compiler = GrammarCompiler(world.tokenizer, FIELDS["vocab_size"], **bounds)
    engine.grammars._compiler = compiler
    compiler.compile_now(fmt(CHOICES))  # the vocabulary's set-up is not what is timed
    return compiler


def test_a_runaway_compile_holds_up_no_other_schema(world, monkeypatch):
    """One worker, held by a compile that runs past the limit and goes on (as xgrammar's do):
    the schema submitted beside it compiles on a thread of its own and is served while the
    runaway still runs, instead of queueing until it ends."""
    engine = world.engine()
    compiler = compiler_for(world, engine, time_limit_s=0.3, workers=1, max_threads=2, slow_s=0.05)  # fmt: skip
    gate = hold_compile(monkeypatch, compiler, ORDER)
    slow = req(world, "slow", (1, 2, 3), params(0), None, fmt(ORDER))
    queued = req(world, "queued", (4, 5, 6), params(0), None, fmt(PERSON))
    got = Run(engine)
    try:
        engine.submit(slow, got.sink)
        engine.submit(queued, got.sink)
        started = time.monotonic()
        got.advance(until=lambda: len(got.done) == 2 or time.monotonic() - started > 5)
        assert set(got.done) == {"slow", "queued"} and not gate.is_set()
    finally:
        gate.set()
    assert got.done["slow"].finish_reason == "error" and got.done["slow"].own_fault
    assert "did not compile within 0.3 s" in got.done["slow"].error
    assert got.done["queued"].finish_reason != "error", got.done["queued"].error
    jsonschema.validate(json.loads(world.tokenizer.decode(got.tokens["queued"])), PERSON)


def test_a_busy_compiler_is_not_the_schemas_fault_and_is_not_cached(world, monkeypatch):
    """The only thread holds a runaway compile: the schema queued behind it and one sent
    after are refused within the limit as the engine's fault (a 503, not a 400), and the
    same schema is served once the thread is free (the refusal was not cached)."""
    engine = world.engine()
    compiler = compiler_for(world, engine, time_limit_s=0.3, workers=1, max_threads=1, slow_s=0.05)  # fmt: skip
    gate = hold_compile(monkeypatch, compiler, ORDER)
    got = Run(engine)
    try:
        engine.submit(req(world, "slow", (1, 2, 3), params(0), None, fmt(ORDER)), got.sink)
        engine.submit(req(world, "queued", (4, 5, 6), params(0), None, fmt(PERSON)), got.sink)
        started = time.monotonic()
        got.advance(until=lambda: len(got.done) == 2 or time.monotonic() - started > 5)
        engine.submit(req(world, "after", (7, 8, 9), params(0), None, fmt(PERSON)), got.sink)
        got.advance(until=lambda: "after" in got.done or time.monotonic() - started > 5)
        # Well inside the 5 s the advance allows: refused at the 0.3 s limit, not left waiting.
        assert time.monotonic() - started < 4.0 and not gate.is_set()
    finally:
        gate.set()
    assert got.done["slow"].own_fault and "did not compile within 0.3 s" in got.done["slow"].error
    for rid in ("queued", "after"):  # queued: refused when slow overran, or at its deadline
        out = got.done[rid]
        assert out.finish_reason == "error" and not out.own_fault and "busy" in out.error, out
        assert out.busy  # the API answers it 503, with Retry-After
    assert "threads are still compiling earlier schemas that overran" in got.done["after"].error
    deadline = time.monotonic() + 5
    while compiler.threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    engine.submit(req(world, "retry", (4, 5, 6), params(0), None, fmt(PERSON)), got.sink)
    got.advance()
    assert got.done["retry"].finish_reason != "error", got.done["retry"].error
    jsonschema.validate(json.loads(got.text("retry", world.tokenizer)), PERSON)


def test_a_tenants_runaway_compiles_hold_up_its_own_requests_only(world, monkeypatch):
    """acme's runaway schema holds its one share of the compiler: acme's next schema is
    refused as its own doing (a 429, not a 503), while globex's same schema is served."""
    engine = world.engine()
    compiler = compiler_for(world, engine, time_limit_s=5.0, workers=2, max_threads=3,
                            slow_s=0.05, per_tenant=1)  # fmt: skip
    gate = hold_compile(monkeypatch, compiler, ORDER)
    got = Run(engine)

    def tenant_req(rid, f, tenant):
        return dataclasses.replace(req(world, rid, (1, 2, 3), params(0), None, fmt(f)),
                                   cache_salt=tenant)  # fmt: skip

    try:
        engine.submit(tenant_req("runaway", ORDER, "acme"), got.sink)
        started = time.monotonic()
        got.advance(until=lambda: compiler.threads() == 1 or time.monotonic() - started > 5)
        time.sleep(0.1)  # past slow_s
        engine.submit(tenant_req("acme", PERSON, "acme"), got.sink)
        engine.submit(tenant_req("globex", PERSON, "globex"), got.sink)
        got.advance(until=lambda: {"acme", "globex"} <= set(got.done) or time.monotonic() - started > 5)  # fmt: skip
        assert not gate.is_set() and "runaway" not in got.done
    finally:
        gate.set()
    out = got.done["acme"]
    assert out.finish_reason == "error" and out.own_fault and out.busy, out
    assert "1 of this tenant's earlier schemas are still compiling" in out.error
    assert got.done["globex"].finish_reason != "error", got.done["globex"].error
    jsonschema.validate(json.loads(got.text("globex", world.tokenizer)), PERSON)


def test_a_submit_that_drops_an_expired_queued_compile_returns():
    """Submitting drops queued compiles whose requests gave up; their futures fail in the
    submitting thread, and their callbacks take the compiler's lock: submit must not hold it."""
    tokenizer = SimpleNamespace(to_json=lambda: "{}")  # only its digest is read here
    compiler = GrammarCompiler(tokenizer, 0, time_limit_s=0.3, workers=1, max_threads=2,
                               slow_s=5.0)  # fmt: skip
    gate = threading.Event()
    compiler._compile = lambda fmt: gate.wait(30) and fmt.schema
    try:
        running = compiler.submit(fmt(ORDER))  # holds the one worker for its first 5 s
        queued = compiler.submit(fmt(PERSON))  # waits for it, until its deadline
        time.sleep(0.4)  # past the queued one's deadline; nothing dispatches before 5 s
        returned = threading.Event()
        thread = threading.Thread(target=lambda: (compiler.submit(fmt(CHOICES)), returned.set()),
                                  daemon=True)  # fmt: skip
        thread.start()
        assert returned.wait(5), "submit never returned: it held the lock its callbacks take"
        assert isinstance(queued.exception(timeout=1), CompilerBusy)
        assert not running.done()
    finally:
        gate.set()
