"""The structured-output benchmarks run, each on its smallest case: constrained decoding, the
compile-cost estimate against real compiles, one tenant's schema flood, xgrammar against
llguidance."""

import pytest

from tests.bench_runs import run_bench as _run


@pytest.mark.slow
def test_structured_bench_quick():
    # The demo engine free, constrained and mixed at batch 1 and 8, then the compile table;
    # with --format tools, rows held to a tool call and no compile table.
    out = _run("bench.structured", "--quick")
    rows = [line for line in out.splitlines() if line.startswith(("| 1 |", "| 8 |"))]
    assert len(rows) == 2 and all(line.endswith("x |") for line in rows), out
    assert "| record |" in out and "| json_object |" in out
    out = _run("bench.structured", "--quick", "--format", "tools")
    rows = [line for line in out.splitlines() if line.startswith(("| 1 |", "| 8 |"))]
    assert len(rows) == 2 and all(line.endswith("x |") for line in rows), out
    assert "decode (tools)" in out and "| record |" not in out


@pytest.mark.slow
def test_grammar_cost_bench_quick():
    # Each shape compiled in a compile process on the demo vocabulary, beside cost.py's estimate.
    from bench.grammar_cost import shapes
    from serving.engine.grammar.cost import pattern_seconds

    out = _run("bench.grammar_cost", "--quick")
    rows = {line.split("|")[1].strip(" *"): line.split("|")[2:-1]
            for line in out.splitlines() if line.startswith("| ")}  # fmt: skip
    del rows["shape"]
    assert list(rows) == list(shapes(quick=True)), out
    assert float(rows[".{1,1000}"][0]) == pytest.approx(pattern_seconds("^.{1,1000}$"), rel=0.01)
    for name, (estimate, cpu, wall, ratio) in rows.items():
        if "skipped" in cpu:
            assert ratio.strip().startswith("< "), (name, out)
        elif float(cpu) > 0:  # (CPU time counts in ticks of 10 ms)
            assert float(wall) > 0 and float(ratio) == pytest.approx(float(estimate) / float(cpu), rel=0.02, abs=0.01), (name, out)  # fmt: skip
    assert "near the budget (*): estimate / cpu from " in out, out


@pytest.mark.slow
def test_grammar_fairness_bench_one_round():
    # acme's flood against globex's and initech's requests, one alone/flooded pair, one run.
    out = _run("bench.grammar_fairness", "--rounds", "1", "--runs", "1")
    rows = [line for line in out.splitlines() if line.startswith(("| globex", "| initech"))]
    assert len(rows) == 2 and all(line.endswith("| 1.2x |") for line in rows), out
    assert "acme sent 0" not in out, out


@pytest.mark.slow
def test_structured_bench_libraries_quick():
    out = _run("bench.structured", "--libraries", "--quick")
    assert out.count("| demo (4096) | ") == 2 + 4, out  # 2 batches, 4 formats
