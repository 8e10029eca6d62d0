"""Compile faults stay with their request: a schema the compiler refuses, or one that
compiles past the time limit, fails that request alone; a slow compile holds up no one
else and is stopped once its request is gone; a format compiles once per engine.
"""

import json
import time

import jsonschema
import pytest

from serving.engine.grammar import compiler as compiler_module
from serving.engine.grammar.compiler import GrammarCompiler, GrammarError
from serving.engine.request import GenerateRequest, ResponseFormat
from tests.serving.engine.test_structured import CHOICES, ORDER, PERSON, Run, fmt, params, req, run
from tests.serving.engine.world import FIELDS, build_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("structured-compiles"))


def good_and_free(world, tag: str) -> list[GenerateRequest]:
    return [
        req(world, f"{tag}-ok", (9, 8, 7), params(0), "mlp", fmt(CHOICES)),
        req(world, f"{tag}-free", (9, 8, 7, 6), params(1, 12), "upper"),
    ]


def assert_unharmed(world, got, requests) -> None:
    ok, free = requests
    assert got.done[ok.request_id].finish_reason == "stop"
    jsonschema.validate(json.loads(got.text(ok.request_id, world.tokenizer)), CHOICES)
    assert got.done[free.request_id].finish_reason == "length"
    assert len(got.tokens[free.request_id]) == 12


def test_a_schema_the_compiler_refuses_fails_that_request_alone(world, engines):
    objekt = ResponseFormat("json_schema", '{"type":"objekt"}', strict=True)
    bad = req(world, "bad", (1, 2, 3), params(0), None, objekt)
    others = good_and_free(world, "refused")
    got = run(engines(), [others[0], bad, others[1]])
    done = got.done["bad"]
    assert done.finish_reason == "error" and done.own_fault
    assert "objekt" in done.error and not got.tokens["bad"] and done.completion_tokens == 0
    assert_unharmed(world, got, others)


# Tens of seconds to compile (variable wide repeats nested in others, ~1 s each on the
# world's vocabulary): past any limit set here, and far over the cost budget, which
# hold_compile's schema skips.
RUNAWAY = json.dumps({"type": "string", "pattern": "^" + "(.{1,100}){1,10}" * 30 + "$"})


def hold_compile(monkeypatch, compiler, schema: dict) -> None:
    """Compiles of schema compile RUNAWAY instead (others compile as usual)."""
    original, slow = compiler._schema, fmt(schema)
    monkeypatch.setattr(compiler, "_schema", lambda f: (RUNAWAY, False) if f == slow else original(f))  # fmt: skip


def test_a_compile_past_the_time_limit_fails_its_request_alone(world, engines, monkeypatch):
    engine = engines()
    compiler = engine.grammars.compiler
    compiler.compile_now(fmt(CHOICES))  # the vocabulary's first compile is not what is timed
    compiler.time_limit_s = 0.5
    hold_compile(monkeypatch, compiler, ORDER)
    others = good_and_free(world, "limit")
    slow = req(world, "slow", (1, 2, 3), params(0), None, fmt(ORDER))
    got = run(engine, [slow, *others])
    done = got.done["slow"]
    assert done.finish_reason == "error" and done.own_fault
    assert "did not compile within 0.5 s" in done.error
    assert_unharmed(world, got, others)


def test_a_grammar_still_compiling_holds_up_no_one(world, engines, monkeypatch):
    """Others are served while a compile runs; once its request is aborted, the compile is
    stopped (its process killed) rather than left to run on."""
    engine = engines()
    compiler = engine.grammars.compiler
    compiler.time_limit_s = 600.0  # however slow this machine, no time-out
    hold_compile(monkeypatch, compiler, ORDER)
    slow = req(world, "slow", (1, 2, 3), params(0), None, fmt(ORDER))
    others = good_and_free(world, "stall")
    got = Run(engine)
    for r in [slow, *others]:
        engine.submit(r, got.sink)
    got.advance(until=lambda: len(got.done) == 2)
    assert set(got.done) == {r.request_id for r in others} and "slow" not in got.tokens
    assert compiler.threads() == 1
    pids = set(compiler.pids())
    engine.abort("slow")
    got.advance(until=lambda: not engine.grammars)
    deadline = time.monotonic() + 30
    while compiler.threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert compiler.threads() == 0  # the process was killed, not left to its tens of seconds
    assert len(pids - set(compiler.pids())) == 1
    assert_unharmed(world, got, others)


def test_a_format_compiles_once(world, engines, monkeypatch):
    engine = engines()
    compiler = engine.grammars.compiler
    calls, original = [], compiler._schema
    monkeypatch.setattr(compiler, "_schema", lambda f: calls.append(f) or original(f))
    same = [fmt(CHOICES), fmt(CHOICES), fmt(CHOICES)]  # equal, not the same object
    other = [fmt(PERSON), ResponseFormat("json_schema", same[0].schema, strict=False)]
    requests = [req(world, f"k{i}", (4, 5, i), params(i, 8), None, f) for i, f in enumerate(same + other)]  # fmt: skip
    got = run(engine, requests)
    assert len(calls) == 3  # the two repeats of CHOICES took the compiled grammar
    assert all(got.done[r.request_id].finish_reason in ("stop", "length") for r in requests)


def test_refused_schemas_stay_within_the_cache_size(world, monkeypatch):
    """A client sending ever new schemas over the cost budget fills the compile cache no more
    than compiled ones do: the least recently used entries go past CACHE_SIZE, and the latest
    refusal is answered from the cache."""
    monkeypatch.setattr(compiler_module, "CACHE_SIZE", 4)
    compiler = GrammarCompiler(world.tokenizer, FIELDS["vocab_size"], workers=1)
    try:
        for i in range(10):
            costly = {"type": "string", "pattern": "^" + "(.{1,100}){1,10}" * 30 + f"x{i}$"}
            refused = compiler.submit(fmt(costly))
            with pytest.raises(GrammarError):
                refused.result(timeout=5)
            assert compiler.num_cached() <= 4
        assert compiler.submit(fmt(costly)) is refused
        assert compiler.pids() == []  # refused before any compile process ran
    finally:
        compiler.shutdown()
