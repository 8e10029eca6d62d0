"""The benchmark scripts run: the CUDA one in its CPU dry run, the CPU one on its smallest case."""

import ast
from pathlib import Path

import pytest

from tests.bench_runs import ROOT
from tests.bench_runs import run_bench as _run


def test_no_bench_module_imports_its_importer():
    # Every import counts, those inside functions too: a helper that imports back the script
    # that imports it is a cycle, however late it runs.
    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts): p
        for p in sorted((ROOT / "bench").rglob("*.py"))
        if p.name != "__init__.py"
    }
    graph = {name: _bench_imports(path, modules) for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            pytest.fail("import cycle: " + " -> ".join([*trail[trail.index(name) :], name]))
        if name not in done:
            for dep in sorted(graph[name]):
                visit(dep, [*trail, name])
            done.add(name)

    for name in graph:
        visit(name, [])


def _bench_imports(path: Path, modules: dict) -> set[str]:
    """The bench modules path imports anywhere in it (`from bench import m` counts as m)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            found |= names & modules.keys()
    return found


def test_bench_does_not_import_the_tests():
    for path in sorted((ROOT / "bench").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            assert not any(n.split(".")[0] == "tests" for n in names), path.relative_to(ROOT)


def test_gpu_all_dry_run_checks_the_triton_kernels():
    out = _run("bench.gpu_all", "--dry-run")
    rows = [line for line in out.splitlines() if line.startswith("| lora vs float64")]
    assert len(rows) == 2 and all(line.endswith("| yes |") for line in rows), out
    assert "fp8 linear vs float64" in out
    assert "| structured output |" in out and "2/2 outputs validate" in out, out
    assert out.count("| decode step graphs / eager |") == 2, out


def test_lora_tuner_dry_run_writes_a_table_the_kernels_read(tmp_path, monkeypatch):
    out_file = tmp_path / "tuned.json"
    out = _run("bench.gpu_lora_tune", "--dry-run", "--out", str(out_file))
    assert out.count("| shrink |") == 4 and out.count("| expand |") == 4, out
    from kernels import lora_tuning

    monkeypatch.setenv("LORASERVE_LORA_CONFIGS", str(out_file))
    lora_tuning.clear_cache()
    try:  # every bucket written, and in a form the launchers' lookup accepts
        table = lora_tuning._table(0)
    finally:
        lora_tuning.clear_cache()
    assert {op: sorted(b) for op, b in table.items()} == {
        op: ["16", "256", "64", "large"] for op in ("shrink", "expand")
    }


@pytest.mark.slow
def test_kernels_bench_quick():
    out = _run("bench.kernels", "--quick")
    assert out.count("\n| 64 | 2048 |") == 3, out


def test_cpu_gemm_bench_quick():
    out = _run("bench.cpu_gemm", "--quick")
    assert out.count("| medium ") == 4 and out.count("x |") == 4, out


@pytest.mark.slow
def test_adapters_bench():
    out = _run("bench.adapters")
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")]
    assert rows[1:] == [
        "raw read of the safetensors file",
        "cold load, registry -> slab (a replica: trusts the published version)",
        "cold load, verified (sha256 + value scan again)",
        "host-tier hit -> slab (acquire: an eviction and the copy)",
        "host -> slab copy (the load alone)",
        "eviction (the acquire's time outside its load)",
    ], out
    assert "load average (1 / 5 / 15 min): " in out, out


@pytest.mark.slow
def test_fleet_bench_quick():
    # 64 adapters against 8 on one server, then how many rank-8 and rank-64 adapters the
    # default slab holds, each on a server of its own.
    out = _run("bench.fleet", "--quick")
    tables = out.split("\n\n")
    fleet = next(t for t in tables if t.startswith("| adapters |")).splitlines()[2:]
    assert [row.split("|")[1:4] for row in fleet] == [
        [" 64 ", " 32 ", " 0 "],
        [" 8 ", " 32 ", " 0 "],
    ]
    assert fleet[0].split("|")[7].strip().endswith("x") and "resident: " in fleet[0], out
    capacity = next(t for t in tables if t.startswith("| rank |")).splitlines()[2:]
    # "16", or ">= 40 (no eviction by then)" where the slab holds more than --quick loads
    held = {int(row.split("|")[1]): row.split("|")[2].strip() for row in capacity}
    assert list(held) == [8, 64], out
    most = {rank: int(h.removeprefix(">= ").split()[0]) for rank, h in held.items()}
    assert most[8] >= most[64] > 0, out  # a rank-64 adapter never takes less room
    assert out.count("load average (1 / 5 / 15 min)") == 2, out


def test_model_bench_tiny():
    out = _run("bench.model", "--shape", "tiny")
    assert "| decoder linears (+ scales) |" in out and "| decode, 8 seqs at context 128 |" in out


@pytest.mark.slow
def test_load_generator_against_an_in_process_server(tmp_path):
    # The API on the tiny test world (uvicorn in a thread, no Ray): cheap, unlike bench.serve
    # itself, which starts loraserve (Ray) and vLLM's server.
    from bench.load import run_load, summarize, workload
    from tests.serving.api.served import chat_world, serve

    models = ["demo", "upper", "rot13"]  # the base model by its id, adapters by name
    requests = workload(9, models)
    with serve(chat_world(tmp_path / "world"), tmp_path, keys={}, owner="default") as served:
        records, wall = run_load(served.url, requests, concurrency=4, max_tokens=5)
        for req, rec in zip(requests, records, strict=True):
            adapter = None if req["model"] == "demo" else req["model"]
            tokens, text = served.reference(served.text_ids(req["prompt"]), adapter, 5)
            assert rec.error is None and (rec.tokens, rec.text) == (len(tokens), text)
            assert 0 < rec.ttft <= rec.seconds <= wall
    figures = summarize(records, wall)
    assert figures["requests"] == 9 and figures["errors"] == 0
    assert figures["output_tokens"] == sum(r.tokens for r in records) > 0
    assert figures["ttft_p50_ms"] <= figures["ttft_p99_ms"]


@pytest.mark.slow
def test_batch_bench_quick():
    # The one-process server with its batch feeder: a 40-item batch alone and beside chats.
    out = _run("bench.batch_api", "--quick")
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert {"idle", "batch alone", "both"} <= set(rows), out
    assert rows["both"].rstrip(" |").endswith("x") and "| 40 |" in rows["batch alone"], out
    assert "Command: python -m bench.batch_api --quick" in out


@pytest.mark.slow
def test_kernels_bench_variants_quick():
    out = _run("bench.kernels", "--variants", "--quick")
    row = next(line for line in out.splitlines() if line.startswith("| 64 | 2048 |"))
    assert row.count("x |") == 2 and row.endswith("% |"), out  # DoRA and bias ratios, rows share


@pytest.mark.slow
def test_engine_share_bench_quick():
    # The tiny model base-only and with 4 adapters, one round each.
    out = _run("bench.engine", "--share", "--quick")
    rows = [line for line in out.splitlines() if line.startswith("| tiny (hidden 256) |")]
    assert [row.split("|")[3].strip() for row in rows] == ["0", "4"], out
    assert rows[0].endswith("| 1.00x |") and "one small torch call:" in out, out


def test_engine_share_counts_the_bytes_a_decode_step_reads(tmp_path):
    # Against transformers' and PEFT's own parameters: every 2-D weight but the embedding.
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    from bench.engine_share import linear_bytes
    from bench.peers.tiny_world import build

    world = build(tmp_path, num_adapters=1, layers=2)
    base = LlamaForCausalLM.from_pretrained(world["model"])
    linears = [p for n, p in base.named_parameters() if p.dim() == 2 and "embed" not in n]
    assert linear_bytes(world["model"] / "model.safetensors") == 4 * sum(p.numel() for p in linears)
    lora = PeftModel.from_pretrained(base, world["adapters"]["adapter0"])
    adapter = [p for n, p in lora.named_parameters() if "lora_" in n]
    assert len(adapter) == 2 * 7 * 2  # A and B on 7 linears of 2 layers
    path = world["adapters"]["adapter0"] / "adapter_model.safetensors"
    assert linear_bytes(path) == 4 * sum(p.numel() for p in adapter)


@pytest.mark.slow
def test_engine_where_bench_quick():
    # The tiny model base-only and with 4 adapters, one round each.
    out = _run("bench.engine", "--where", "--quick")
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| tiny ")]
    assert [row[1].strip() for row in rows] == ["0", "4"], out
    base, lora = rows
    assert float(base[6]) == 0.0 and base[7].strip() == "-", out  # no LoRA op without adapters
    assert float(lora[6]) > 0.0 and float(lora[5]) > 0.0, out


def test_engine_where_clocks_nest_inside_the_step_and_are_removed(tmp_path):
    from bench.engine_runs import loraserve_run, workload
    from bench.engine_where import clocked
    from bench.peers.tiny_world import build
    from serving.engine.engine import Engine
    from serving.model import linear
    from serving.model.linear import Linear

    world = build(tmp_path, num_adapters=1, layers=2)
    originals = Linear.__call__, Engine.step, linear.lora_shrink
    seen = {}
    for count in (0, 1):
        with clocked(num_tokens=3) as steps:  # 3 prompts: the decode steps of the timed run
            loraserve_run(world, workload(3, ["adapter0"][:count]), max_loras=1)
        seen[count] = steps
    assert (Linear.__call__, Engine.step, linear.lora_shrink) == originals
    for count, steps in seen.items():
        assert len(steps) >= 60, count  # 64 new tokens: all but the prefill's are decode steps
        for step, forward, base, lora, plan in steps:
            assert step >= forward >= base + lora + plan and base > 0
            assert (lora > 0) == (count == 1)
