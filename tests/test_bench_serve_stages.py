"""bench/serve.py's stage profile without servers: the stage rules on stacks as py-spy writes
them, the split of threads' CPU by stage, the script that rereads a run's files, and py-spy on
a real process."""

import json
import subprocess
import sys
import textwrap
import time

import pytest

from bench.serve_stages import (
    IDLE,
    NATIVE,
    OTHER,
    STAGE_NAMES,
    STAGES,
    Profile,
    parse_raw,
    stage_of,
)

SITE = "/venv/lib/python3.11/site-packages"
LIB = "/usr/lib/python3.11"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
BOOT = f"Thread._bootstrap ({LIB}/threading.py:995);Thread.run ({LIB}/threading.py:975)"

# py-spy's raw lines (--threads, line numbers kept as py-spy writes them without --nolineno),
# each with the stage a reader would give it.
CASES = [
    (f"thread (11): engine;{BOOT};step (/srv/serving/engine/step_loop.py:40);"
     f"forward (/srv/serving/model/llama.py:80);linear ({SITE}/torch/nn/functional.py:1)",
     "engine compute"),
    # the tokenizer's file is more specific than serving/model's rule
    (f"thread (11): engine;{BOOT};step (/srv/serving/engine/stopping.py:9);"
     f"DecodeStream.step (/srv/serving/model/tokenizer.py:130)", "detokenize"),
    # frames no rule knows (queue, threading) pass the sample on to their caller
    (f"thread (11): engine;{BOOT};run (/srv/serving/engine/step_loop.py:20);"
     f"Queue.get ({LIB}/queue.py:171);Condition.wait ({LIB}/threading.py:320)",
     "engine bookkeeping"),
    (f"thread (12): loop;{BOOT};chunk (/srv/serving/api/openai/routes.py:50);"
     f"dumps ({LIB}/json/__init__.py:231);iterencode ({LIB}/json/encoder.py:258)", "SSE and JSON"),
    (f"thread (12): loop;{BOOT};send ({SITE}/uvicorn/protocols/http/httptools_impl.py:500);"
     f"_SelectorSocketTransport.write ({LIB}/asyncio/selector_events.py:1060)", "socket I/O"),
    (f"thread (12): loop;{BOOT};handle (/srv/serving/api/edge/request_id.py:30);"
     f"__call__ ({SITE}/starlette/routing.py:700)", "HTTP server"),
    (f"thread (12): loop;{BOOT};resolve_for (/old/adapters/registry/visibility.py:12);"
     f"_open ({SITE}/fsspec/implementations/local.py:360)", "registry and usage stores"),
    (f"thread (12): loop;{BOOT};metrics_task ({SITE}/ray/serve/_private/metrics_utils.py:90)",
     "Ray Serve and Ray core"),
    # Ray's event loop thread, uvloop in C under Thread.run: the loop's own work
    (f"thread (12): AsyncIO Thread: default;{BOOT}", "asyncio loop"),
    (f"thread (13): pool;{BOOT};_worker ({LIB}/concurrent/futures/thread.py:81)", "thread pools"),
    ("thread (14)", NATIVE),  # a thread at work with no Python frame
    ("thread (15): x;<module> (/tmp/script.py:3);spin (/tmp/script.py:9)", OTHER),
    # --native frames: a wait in libc is idle, CPython's GIL wait too; Cython and C++ are known
    (f"thread (12): loop;{BOOT};run_forever (/project/uvloop/loop.c:1);"
     f"uv__io_poll (/project/build/libuv-x86_64/src/unix/linux.c:1);epoll_pwait ({LIBC})", IDLE),
    (f"thread (11): engine;{BOOT};step (/srv/serving/engine/engine.py:1);"
     f"take_gil (/usr/lib/libpython3.11.so.1.0);0x7f4bf0e4524a ({LIBC})", IDLE),
    (f"thread (12): loop;{BOOT};Handle__run (/project/uvloop/loop.c:1);"
     f"submit_actor_task ({SITE}/ray/_raylet.so);pthread_mutex_lock ({LIBC})",
     "Ray Serve and Ray core"),
    (f"thread (21): VLLM::EngineCor;run_busy_loop ({SITE}/vllm/v1/engine/core.py:1);"
     f"acquire_read ({SITE}/vllm/distributed/device_communicators/shm_broadcast.py:1);"
     f"sched_yield ({SITE}/vllm/distributed/utils.py:1)", "inter-process messaging"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "stage"), CASES, ids=[s for _, s in CASES])
def test_a_stack_goes_to_the_stage_of_its_deepest_known_frame(line, stage):
    stacks = parse_raw(f"{line} 7\n")
    [(stack, n)] = stacks.items()
    assert n == 7 and stage_of(stack) == stage
    assert not any(":" in frame.rsplit("(", 1)[-1] for frame in stack[1:])  # no line numbers


def test_every_stage_has_a_row():
    assert set(STAGE_NAMES) == {s for s, _ in STAGES} | {"thread pools", OTHER, NATIVE}


def test_a_line_that_is_not_py_spys_raw_format_is_named():
    with pytest.raises(ValueError, match="line 2 is not py-spy's raw format"):
        parse_raw("a (x.py) 1\nno count here\n")


RAW = f"""\
thread (1): A;f (/srv/serving/model/x.py) 3
thread (1): A;g (/srv/serving/api/core/sse.py) 1
thread (1): A;epoll_wait ({LIBC}) 4
thread (2): B;h (/srv/serving/engine/y.py) 2
"""


def _profile() -> Profile:
    # Thread 1: 0.4 s over 4 samples at work (the 4 idle ones left out); thread 2 ended: it
    # gets what the process spent beyond its live threads; thread 3 was never sampled.
    threads = {1: ("A", 0.4), 3: ("C", 0.2)}
    return Profile("p", parse_raw(RAW), tokens=1000, rate=250, threads=threads, cpu_seconds=0.7)


def test_each_threads_cpu_is_split_as_its_samples_at_work():
    seconds = _profile().stage_seconds()
    assert seconds == pytest.approx(
        {"engine compute": 0.3, "SSE and JSON": 0.1, "engine bookkeeping": 0.1, NATIVE: 0.2}
    )


def test_without_kernel_figures_samples_over_rate_stand_in():
    p = Profile("p", parse_raw(RAW), tokens=1000, rate=250)
    assert p.stage_seconds() == pytest.approx(
        {"engine compute": 3 / 250, "SSE and JSON": 1 / 250, "engine bookkeeping": 2 / 250}
    )


def test_the_profile_script_rereads_what_a_run_kept(tmp_path):
    (tmp_path / "p-1.txt").write_text(RAW)
    meta = {"label": "srv: one", "tokens": 1000, "rate": 250, "errors": 1, "cpu_seconds": 0.7,
            "threads": {"1": ["A", 0.4], "3": ["C", 0.2]}}  # fmt: skip
    (tmp_path / "p-1.json").write_text(json.dumps(meta))
    out = _run("bench.serve_profile", str(tmp_path), "--verbose").stdout
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in out.splitlines()
            if line.startswith("| ")}  # fmt: skip
    # ms per 1000 tokens: seconds * 1000 here, and the share of the process's CPU
    assert rows["engine compute"] == "300 (43%)" and rows["SSE and JSON"] == "100 (14%)"
    assert rows[NATIVE] == "200 (29%)" and rows["all stages"] == "700"
    assert rows["process CPU (kernel)"] == "700"
    assert rows["samples: at work / idle / unreadable"] == "6 / 4 / 1"
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _run("bench.serve_profile", str(empty), check=False)
    assert done.returncode == 2 and "no profiles" in done.stderr


def _run(*args, check=True):
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert not check or done.returncode == 0, done.stderr[-2000:]
    return done


def test_py_spy_on_a_real_process_finds_its_stage(tmp_path):
    # A process that encodes JSON on a thread of its own: py-spy's stacks, its thread ids and
    # the kernel's thread times must meet.
    from bench.serve_profile import profile_run

    code = textwrap.dedent("""
        import json, threading, time
        def work():
            end = time.time() + 30
            while time.time() < end:
                json.dumps({"a": list(range(200))})
        threading.Thread(target=work, name="encoder").start()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.5)
        [p] = profile_run({"json": proc.pid}, lambda: time.sleep(1.5) or 1000, tmp_path)
    finally:
        proc.kill()
        proc.wait()
    seconds = p.stage_seconds()
    assert seconds["SSE and JSON"] > 0.5 * seconds.total() and p.cpu_seconds > 0.5
    assert max(s for _, s in p.threads.values()) > 0.5  # the encoder's, by its thread id
    assert sum(p.stacks.values()) > 100 and p.tokens == 1000
