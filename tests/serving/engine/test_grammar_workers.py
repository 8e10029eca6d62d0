"""Grammar compile processes: a compile past its time limit, or one no request waits for,
is stopped by killing its process (a new one takes its place at once); tenants take turns;
masks from a grammar compiled in a process equal those of one compiled in this one; the
processes load no torch.
"""

import dataclasses
import json
import os
import random
import threading
import time

import pytest
import torch
import xgrammar

from serving.engine.grammar.compiler import GrammarCompiler, _make_tokenizer_info
from serving.engine.grammar.ebnf import no_raw_controls, reparseable
from serving.engine.grammar.formats import prepared
from serving.engine.grammar.matcher import RowGrammar
from serving.engine.grammar.workers import CompilerBusy, GrammarError, OwnerBusy
from tests.serving.engine.test_structured import CHOICES, ORDER, PERSON, Run, fmt, params, req
from tests.serving.engine.test_structured_compiles import RUNAWAY, hold_compile
from tests.serving.engine.world import FIELDS, build_world

DATES = {"type": "object", "properties": {"d": {"type": "string", "format": "date-time"},
                                          "p": {"type": "string", "pattern": "^[a-z]{2,9}$"}}}  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("workers"))


@pytest.fixture
def make(world, monkeypatch):
    """GrammarCompilers over the world's vocabulary, shut down after the test; formats of
    ORDER compile RUNAWAY (tens of seconds) instead."""
    made = []

    def make_(**bounds) -> GrammarCompiler:
        compiler = GrammarCompiler(world.tokenizer, FIELDS["vocab_size"], **bounds)
        original = compiler._schema
        runaway = fmt(ORDER)
        monkeypatch.setattr(compiler, "_schema", lambda f: (RUNAWAY, False) if f == runaway else original(f))  # fmt: skip
        made.append(compiler)
        return compiler

    yield make_
    for compiler in made:
        compiler.shutdown()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_compile_past_its_limit_is_killed_and_the_next_runs_at_once(make):
    compiler = make(time_limit_s=1.0, workers=1)
    compiler.compile_now(fmt(CHOICES))  # the process is up
    [pid] = compiler.pids()
    with pytest.raises(GrammarError, match=r"did not compile within 1 s"):
        compiler.submit(fmt(ORDER)).result(timeout=30)
    assert wait_for(lambda: not alive(pid))  # killed, its CPU free, not left to run on
    assert compiler.compile_now(fmt(PERSON)) is not None  # a fresh process took its place
    assert compiler.threads() == 0 and compiler.pids() and pid not in compiler.pids()
    with pytest.raises(GrammarError, match="did not compile"):  # cached: never run again
        compiler.submit(fmt(ORDER)).result(timeout=0.1)


def test_a_compile_no_request_waits_for_is_killed(make):
    compiler = make(time_limit_s=600.0, workers=1)
    compiler.compile_now(fmt(CHOICES))
    [pid] = compiler.pids()
    first, second = compiler.submit(fmt(ORDER)), compiler.submit(fmt(ORDER))
    assert first is second and wait_for(lambda: compiler.threads() == 1)
    compiler.release(compiler.key(fmt(ORDER)))
    time.sleep(0.3)
    assert alive(pid) and not first.done()  # one request still waits
    compiler.release(compiler.key(fmt(ORDER)))
    with pytest.raises(CompilerBusy, match="no request waits"):
        first.result(timeout=10)
    assert wait_for(lambda: not alive(pid))
    assert compiler.compile_now(fmt(ORDER.copy() | {"title": "x"})) is not None
    # Not cached as a failure: the schema never failed, its requests went away.
    assert compiler.submit(fmt(ORDER)) is not first


def test_tenants_take_turns(make):
    """acme queues four schemas before globex sends one: globex's runs second, not fifth."""
    compiler = make(time_limit_s=60.0, workers=1, per_tenant=1)
    compiler.compile_now(fmt(CHOICES))
    done = []
    acme = [compiler.submit(fmt({"type": "string", "pattern": f"^{i}.{{1,400}}$"}), "acme")
            for i in range(4)]  # fmt: skip
    globex = compiler.submit(fmt(PERSON), "globex")
    for name, future in [*(("acme", f) for f in acme), ("globex", globex)]:
        future.add_done_callback(lambda f, name=name: done.append(name))
    for future in (*acme, globex):
        future.result(timeout=60)
    assert done.index("globex") <= 1, done


def test_a_tenants_full_queue_is_its_own_doing(make):
    compiler = make(time_limit_s=600.0, workers=1, per_tenant=1)
    compiler._pool.max_queued = 2
    compiler.compile_now(fmt(CHOICES))
    compiler.submit(fmt(ORDER), "acme")  # runs
    assert wait_for(lambda: compiler.threads() == 1)
    for i in range(2):
        compiler.submit(fmt({"type": "string", "pattern": f"^{i}$"}), "acme")
    refused = compiler.submit(fmt(PERSON), "acme")
    with pytest.raises(OwnerBusy, match="already has 2 schemas waiting"):
        refused.result(timeout=1)
    assert "stopped 600 s after it began" in str(refused.exception())
    assert compiler.submit(fmt(PERSON), "globex") is not refused  # not cached


def test_the_processes_load_no_torch_and_end_with_the_compiler(make):
    compiler = make(workers=2)
    compiler.start()
    assert wait_for(lambda: len(compiler.pids()) == 2)
    pids = compiler.pids()
    for pid in pids:
        with open(f"/proc/{pid}/maps") as maps:
            assert "libtorch" not in maps.read()
        with open(f"/proc/{pid}/status") as status:
            rss = next(line for line in status if line.startswith("VmRSS:"))
        assert int(rss.split()[1]) < 150 * 1024, rss  # KiB: this process's alone is far more
    compiler.shutdown()
    assert not any(alive(pid) for pid in pids)


def in_process(world, f):
    """f compiled in this process, as the compile processes do it."""
    info = _make_tokenizer_info(world.tokenizer, FIELDS["vocab_size"])
    schema = json.dumps(prepared(json.loads(f.schema)))
    grammar = xgrammar.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=f.strict)
    ebnf = no_raw_controls(reparseable(str(grammar)))
    return xgrammar.GrammarCompiler(info, max_threads=1).compile_grammar(ebnf)


@pytest.mark.parametrize("schema", [CHOICES, PERSON, DATES], ids=["choices", "person", "dates"])
def test_masks_from_a_process_equal_those_of_an_in_process_compile(world, make, schema):
    compiler = make()
    theirs, ours = RowGrammar(compiler.compile_now(fmt(schema))), RowGrammar(in_process(world, fmt(schema)))  # fmt: skip
    rng = random.Random(0)
    a, b = theirs.allocate(1), ours.allocate(1)
    for _ in range(60):
        theirs.fill(a, 0)
        ours.fill(b, 0)
        assert torch.equal(a, b)
        bits = (a[0].unsqueeze(-1) >> torch.arange(32, dtype=a.dtype)) & 1
        allowed = bits.flatten()[: theirs.vocab_size].nonzero().flatten().tolist()
        if not allowed or theirs.terminated:
            break
        token = rng.choice(allowed)
        assert theirs.accept(token) and ours.accept(token)


def test_a_waiting_request_hashes_its_format_once_not_every_step(world, monkeypatch):
    """While a request waits on its compile, each step looks whether the compile ran past
    the limit, without hashing the format again (a schema of up to 32 KiB, and one tenant
    may have ten waiting)."""
    engine = world.engine()
    compiler = engine.grammars.compiler
    compiler.time_limit_s = 600.0
    hold_compile(monkeypatch, compiler, ORDER)
    keys, original = [], compiler.key
    monkeypatch.setattr(compiler, "key", lambda f: keys.append(f) or original(f))
    got = Run(engine)
    try:
        engine.submit(req(world, "slow", (1, 2, 3), params(0), None, fmt(ORDER)), got.sink)
        engine.submit(req(world, "free", (9, 8, 7), params(1, 40, ignore_eos=True)), got.sink)
        got.advance(until=lambda: "free" in got.done)
        assert got.step >= 40 and "slow" not in got.done  # it waited through every step
        assert len(keys) <= 2, len(keys)  # its submission's, not one per step
    finally:
        engine.shutdown()


def tokens_of(engine, request) -> tuple[list[int], str | None]:
    """request's output tokens and its error, once it ended (the engine's loop running)."""
    finished, tokens, error = threading.Event(), [], []

    def sink(out) -> None:
        tokens.extend(out.new_token_ids)
        if out.finished:
            error.append(out.error)
            finished.set()

    engine.submit(request, sink)
    assert finished.wait(120)
    return tokens, error[0]


@pytest.mark.slow
def test_one_tenant_resubmitting_costly_schemas_slows_no_other_tenant(world, monkeypatch):
    """While acme floods costly schemas (two of its compiles running, more queued behind them),
    initech's schema starts compiling before every one of acme's queued ahead of it, acme never
    holds more than its two workers, and initech's request and globex's plain completion end
    as they do alone, token for token. Their time against alone is a figure of
    bench/grammar_fairness.py, not a test's (within 1.2x)."""
    engine = world.engine()
    engine.start()
    pool = engine.grammars.compiler._pool
    submitted, most_running = [], [0]  # (owner, job, acme's jobs queued when it came)
    submit, next_job = pool.submit, pool._next_job

    def spied_submit(schema, strict, deadline, owner=None, kind="json_schema"):
        with pool._cond:
            ahead = list(pool._queues.get("acme", ()))
        job = submit(schema, strict, deadline, owner, kind)
        submitted.append((owner, job, ahead))
        return job

    def spied_next_job():  # called with the pool's lock held, as a worker takes a job
        job = next_job()
        running = [j.owner for j in pool._running.values()] + [job.owner if job else None]
        most_running[0] = max(most_running[0], running.count("acme"))
        return job

    monkeypatch.setattr(pool, "submit", spied_submit)
    monkeypatch.setattr(pool, "_next_job", spied_next_job)
    sent, stop = [], threading.Event()

    def flood() -> None:
        while not stop.is_set():
            n = len(sent)
            costly = {"type": "object", "properties": {
                f"p{n}_{i}": {"type": "string", "pattern": "^.{1,1000}$"} for i in range(5)}}  # fmt: skip
            sent.append(f"acme{n}")
            engine.submit(tenant_req(world, sent[-1], costly, "acme"), lambda out: None)
            time.sleep(0.05)

    def both(tag: str) -> tuple:
        plain = dataclasses.replace(req(world, f"g{tag}", (5, 6, 7), params(0, 48, ignore_eos=True)), cache_salt="globex")  # fmt: skip
        small = CHOICES | {"title": tag}  # a new schema each time: compiled, not cached
        return tokens_of(engine, plain), tokens_of(engine, tenant_req(world, f"i{tag}", small, "initech"))  # fmt: skip

    flooder = threading.Thread(target=flood, daemon=True)
    try:
        alone = both("alone")
        assert alone[0][1] is None and alone[1][1] is None and alone[1][0], alone
        flooder.start()
        waits = []
        for i in range(3):
            # acme's share of the workers busy and its next schemas queued
            assert wait_for(lambda: pool.threads() >= 2 and len(pool._queues.get("acme", ())) >= 2)  # fmt: skip
            assert both(f"loaded{i}") == alone
            [(initech, ahead)] = [(j, a) for o, j, a in submitted if o == "initech" and j.schema.find(f"loaded{i}") >= 0]  # fmt: skip
            waits.append(len(ahead))
            assert all(j.started is None or j.started > initech.started for j in ahead), i
    finally:
        stop.set()
        if flooder.is_alive():
            flooder.join()
        for rid in sent:
            engine.abort(rid)
        engine.shutdown()
    assert max(waits) >= 2, waits  # acme's schemas were queued ahead of initech's
    assert most_running[0] == 2  # acme filled its share, never more
    assert len(sent) > 10


def tenant_req(world, rid: str, schema: dict, tenant: str):
    return dataclasses.replace(req(world, rid, (1, 2, 3), params(0, 60), None, fmt(schema)),
                               cache_salt=tenant)  # fmt: skip
