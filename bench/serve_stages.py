"""A server process's CPU time split by stage, from py-spy's stacks and the kernel's thread times.

Each sample's stack (py-spy's raw format, with thread ids) is put in one stage by its deepest
frame that a rule of STAGES knows, leaf first; frames no rule knows (threading, queue,
contextlib, CPython's own C) pass it on to their callers, and a stack none of whose frames a
rule knows is "other". A thread's CPU time as the kernel counts it is then split over the
stages as that thread's samples at work are. Not samples / rate alone: py-spy counts a thread
that is ready to run but waits for a core or for the GIL as busy, so on a crowded host the
samples add up to more thread-seconds than the CPU spent. Samples of a thread waiting (with
--native py-spy keeps them) are IDLE and left out. The CPU of threads never sampled at work
is NATIVE: they run no Python (Ray's core worker and gRPC threads, torch's OpenMP pool); so
are samples of a thread at work with no frame at all. Threads that ended before the end share
what the process spent beyond its live threads, by their samples.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass, field

# (stage, pattern on a frame "function (path)"), the first match winning for a frame; the
# specific files come before the packages that hold them (the tokenizer before serving/model).
STAGES: tuple[tuple[str, str], ...] = (
    ("detokenize", r"/tokenizers/|/serving/model/(tokenizer|decode_stream)\.py|^decode_stream |"
                   r"/vllm/v1/engine/detokenizer\.py|/transformers/tokenization"),
    ("SSE and JSON", r"/serving/api/core/sse\.py|/sse_starlette/|/json/|/_json\.c|"
                     r"^model_dump_json "),
    ("engine compute", r"/torch/|/serving/model/|/kernels/|/numpy/|/safetensors/|"
                       r"/vllm/model_executor/|/vllm/v1/worker/|/vllm/v1/attention/|/vllm/lora/"),
    ("registry and usage stores", r"/adapters/registry/|/fsspec/|/serving/usage/|/sqlite3/"),
    ("engine bookkeeping", r"/serving/engine/|/adapters/|/vllm/v1/core/|/vllm/v1/engine/|"
                           r"/vllm/v1/sample/"),
    # vLLM's engine core and model worker hand steps over shared memory, waiting by spinning.
    ("inter-process messaging", r"/zmq/|/msgspec/|/vllm/v1/serial_utils\.py|"
                                r"/vllm/distributed/|/vllm/v1/executor/"),
    ("Ray Serve and Ray core", r"/ray/|_raylet|/grpc/"),
    ("socket I/O", r"/asyncio/(selector_events|streams|transports)\.py"),
    ("HTTP server", r"/uvicorn/|/h11/|/httptools/|/starlette/|/fastapi/|/anyio/"),
    ("app routes and middleware", r"/serving/|/vllm/entrypoints/|/pydantic"),
    ("asyncio loop", r"/asyncio/|_asynciomodule|/uvloop/|/libuv|/selectors\.py"),
)  # fmt: skip
# Rules for the leaf frame alone, before STAGES: above other frames these say nothing. A
# stack that ends at Thread.run runs its thread's target in C: in a Ray worker that is the
# actor's event loop ("AsyncIO Thread: default", uvloop's run_forever), whose own work has no
# Python frame. One that ends in a pool thread's loop takes its next work item or runs one
# written in C.
LEAF_STAGES: tuple[tuple[str, str], ...] = (
    ("asyncio loop", r"^Thread\.run \(\S*threading\.py\)$"),
    ("thread pools", r"^(_worker|_WorkItem\.run) \(\S*concurrent/futures/thread\.py\)$"),
)
OTHER = "other"
NATIVE = "threads not seen at work (native)"
IDLE = "idle"  # samples of a thread waiting, left out: it spends no CPU there
# A wait in the C library or CPython's lock (the GIL's too), and the frames of system
# libraries (their symbols often unresolved) under which it is looked for.
_WAIT = re.compile(r"^(epoll_p?wait|e?poll|ppoll|p?select|pthread_cond_(timed|clock)?wait|"
                   r"sem_(timed|clock)?wait|\w*futex\w*|(clock_)?nanosleep|"
                   r"PyThread_acquire_lock_timed|take_gil)$")  # fmt: skip
_SYSTEM_LIB = re.compile(r"/(libc|libpthread|ld-linux)[^/]*$")
# The tables' order: the engine's work, the request's way out, then what carries it.
STAGE_NAMES = (
    "engine compute", "engine bookkeeping", "detokenize", "registry and usage stores",
    "app routes and middleware", "SSE and JSON", "HTTP server", "socket I/O", "asyncio loop",
    "thread pools", "Ray Serve and Ray core", "inter-process messaging", OTHER, NATIVE,
)  # fmt: skip
_RULES = [(stage, re.compile(pattern)) for stage, pattern in STAGES]
_LEAF_RULES = [(stage, re.compile(pattern)) for stage, pattern in LEAF_STAGES]
_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>.*?)(?::\d+)?\)$")
_THREAD = re.compile(r"^thread \((?P<tid>\d+)\)")  # py-spy --threads: "thread (TID): NAME"

Stack = tuple[str, ...]  # frames "function (path)", outermost first, after a thread frame


def parse_raw(text: str) -> Counter[Stack]:
    """py-spy's raw format (one "frame;frame;... count" line per stack) as {stack: samples}.

    Line numbers are dropped, so one function's samples gather in one frame.
    """
    stacks: Counter[Stack] = Counter()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        head, _, count = line.rpartition(" ")
        if not head or not count.isdigit():
            raise ValueError(f"line {number} is not py-spy's raw format: {line[:120]!r}")
        frames = []
        for frame in head.split(";"):
            m = _FRAME.match(frame)
            frames.append(f"{m['func']} ({m['path']})" if m and not _THREAD.match(frame) else frame)
        stacks[tuple(frames)] += int(count)
    return stacks


def thread_of(stack: Stack) -> int | None:
    """The OS thread id of a stack recorded with --threads, else None."""
    m = _THREAD.match(stack[0]) if stack else None
    return int(m["tid"]) if m else None


def is_idle(stack: Stack) -> bool:
    """Whether a stack waits: a wait call of the C library, or CPython's lock wait, at its
    leaf or under it in system libraries (py-spy leaves idle threads out itself, but not
    with --native)."""
    for frame in reversed(stack):
        m = _FRAME.match(frame)
        if not m:
            return False
        if _WAIT.match(m["func"]):
            return True
        if not (m["func"].startswith("0x") or _SYSTEM_LIB.search(m["path"])):
            return False
    return False


@functools.lru_cache(maxsize=65536)
def stage_of(stack: Stack) -> str:
    """IDLE, else the stage of the deepest frame a rule knows; "other" if none, NATIVE if the
    stack has no frame at all (a thread py-spy found at work outside Python)."""
    frames = stack[1:] if thread_of(stack) is not None else stack
    if not frames:
        return NATIVE
    if is_idle(frames):
        return IDLE
    for stage, rule in _LEAF_RULES:
        if rule.search(frames[-1]):
            return stage
    for frame in reversed(frames):
        for stage, rule in _RULES:
            if rule.search(frame):
                return stage
    return OTHER


@dataclass
class Profile:
    """One process's samples over a run that produced `tokens` output tokens."""

    label: str
    stacks: Counter[Stack]
    tokens: int
    rate: int
    threads: dict[int, tuple[str, float]] = field(default_factory=dict)  # {tid: (name, CPU s)}
    cpu_seconds: float | None = None  # the whole process's, ended threads included
    errors: int = 0  # samples py-spy failed to read

    def busy(self) -> dict[int | None, Counter[Stack]]:
        """{thread id: {stack: samples}}, the idle samples left out."""
        out: dict[int | None, Counter[Stack]] = {}
        for stack, n in self.stacks.items():
            if stage_of(stack) != IDLE:
                out.setdefault(thread_of(stack), Counter())[stack] += n
        return out

    def stack_seconds(self) -> tuple[Counter[Stack], float]:
        """CPU seconds by stack, each thread's kernel time split as its busy samples are, and
        the CPU of the threads with no busy sample.

        The threads that ended share what the process spent beyond its live threads, by
        their samples; with no kernel figures at all, a thread's samples / rate stand in.
        """
        busy = self.busy()
        alive = {tid: s for tid, (_, s) in self.threads.items()}
        ended = sum(c.total() for tid, c in busy.items() if tid not in alive)
        rest = (
            None if self.cpu_seconds is None else max(0.0, self.cpu_seconds - sum(alive.values()))
        )
        out: Counter[Stack] = Counter()
        for tid, stacks in busy.items():
            n_busy = stacks.total()
            if tid in alive:
                cpu = alive[tid]
            else:
                cpu = n_busy / self.rate if rest is None else rest * n_busy / ended
            for stack, n in stacks.items():
                out[stack] += cpu * n / n_busy
        unsampled = sum(s for tid, s in alive.items() if tid not in busy)
        return out, unsampled + (rest if rest and not ended else 0.0)

    def stage_seconds(self) -> Counter[str]:
        """CPU seconds by stage (NATIVE: the threads with no busy sample)."""
        by_stack, unsampled = self.stack_seconds()
        out: Counter[str] = Counter()
        for stack, seconds in by_stack.items():
            out[stage_of(stack)] += seconds
        if unsampled:
            out[NATIVE] += unsampled
        return out

    def ms_per_1k(self, seconds: float) -> float:
        return seconds * 1e6 / self.tokens if self.tokens else 0.0


def table(profiles: list[Profile]) -> list[str]:
    """Stages down, processes across: CPU ms per 1,000 output tokens (share of the process's)."""
    if not profiles:
        return []
    by = [p.stage_seconds() for p in profiles]
    lines = ["| stage | " + " | ".join(p.label for p in profiles) + " |",
             "|---|" + "---:|" * len(profiles)]  # fmt: skip
    for stage in STAGE_NAMES:
        cells = [f"{p.ms_per_1k(s[stage]):.0f} ({s[stage] / (s.total() or 1):.0%})"
                 for p, s in zip(profiles, by, strict=True)]  # fmt: skip
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    lines.append("| all stages | " + " | ".join(
        f"{p.ms_per_1k(s.total()):.0f}" for p, s in zip(profiles, by, strict=True)) + " |")  # fmt: skip
    lines.append("| process CPU (kernel) | " + " | ".join(
        "-" if p.cpu_seconds is None else f"{p.ms_per_1k(p.cpu_seconds):.0f}"
        for p in profiles) + " |")  # fmt: skip
    cells = []
    for p in profiles:
        n_busy = sum(c.total() for c in p.busy().values())
        cells.append(f"{n_busy} / {sum(p.stacks.values()) - n_busy} / {p.errors}")
    lines.append("| samples: at work / idle / unreadable | " + " | ".join(cells) + " |")
    return lines


def details(profile: Profile, top: int = 10) -> list[str]:
    """The `top` leaf frames of the CPU in "other", and the busiest threads' stages."""
    by_stack, _ = profile.stack_seconds()
    leaves: Counter[str] = Counter()
    for stack, seconds in by_stack.items():
        if stage_of(stack) == OTHER:
            leaves[stack[-1]] += seconds
    lines = [f"{profile.label}: CPU ms per 1000 tokens in {OTHER}, by leaf frame:"]
    lines += [f"    {profile.ms_per_1k(s):7.0f}  {leaf}" for leaf, s in leaves.most_common(top)]
    lines.append("  threads: CPU ms per 1000 tokens (kernel), samples at work, stages")
    busy = profile.busy()
    cpu = {tid: s for tid, (_, s) in profile.threads.items()}
    for tid in sorted(cpu.keys() | busy.keys(), key=lambda t: -cpu.get(t, 0.0))[:top]:
        stages: Counter[str] = Counter()
        for stack, n in busy.get(tid, Counter()).items():
            stages[stage_of(stack)] += n
        name = profile.threads.get(tid, ("(ended)", 0.0))[0]
        most = ", ".join(f"{s} {n / stages.total():.0%}" for s, n in stages.most_common(3))
        lines.append(f"    {profile.ms_per_1k(cpu.get(tid, 0.0)):7.0f}  {stages.total():5d}  "
                     f"{name} ({tid}): {most or '-'}")  # fmt: skip
    return lines
