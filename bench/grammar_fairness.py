"""One tenant flooding costly schemas against the others' latency, on the demo kit (CPU).

    python -m bench.grammar_fairness [--rounds 16] [--runs 3]

acme sends a new costly schema (five 1,000-character pattern strings, just under the cost
budget) every 50 ms, so its two compile workers stay busy and its queue full. Meanwhile
globex's plain completion (48 tokens) and initech's small structured request (a new schema
each time: compiled, never cached) are timed, submit to last token, against the same two
alone. Phases alternate, each going first in turn (A L L A A L ...), so that a drift in the
host's other load weighs on both; each phase times both requests twice. A run's figure is
the median of its loaded samples over the median of its alone ones; --runs runs, the middle
reported. Target: both within 1.2x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

import torch

from bench.structured_workload import response_format
from bench.timing import machine
from serving.engine.engine import Engine, EngineConfig
from serving.engine.request import GenerateRequest, SamplingParams
from serving.engine.scheduler import SchedulerConfig
from serving.model.loader import load_model

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo"
SMALL = {"type": "object", "properties": {"answer": {"enum": ["yes", "no", "maybe"]}},
         "required": ["answer"], "additionalProperties": False}  # fmt: skip
PROMPT = (5, 6, 7)
SAMPLES = 2  # each request timed this many times per phase


def costly(n: int) -> dict:
    """acme's nth schema: five long pattern strings, new names each time."""
    return {"type": "object", "properties": {
        f"p{n}_{i}": {"type": "string", "pattern": "^.{1,1000}$"} for i in range(5)}}  # fmt: skip


def timed(engine: Engine, request: GenerateRequest) -> float:
    """Seconds from submitting request to its last output (the engine's loop running)."""
    finished = threading.Event()
    engine.submit(request, lambda out: out.finished and finished.set())
    began = time.perf_counter()
    if not finished.wait(120):
        raise RuntimeError(f"{request.request_id} did not finish within 120 s")
    return time.perf_counter() - began


class Flood:
    """acme's schemas, one every 50 ms, while running."""

    def __init__(self, engine: Engine):
        self.engine, self.sent = engine, []
        self._stop, self._thread = threading.Event(), None

    def __enter__(self) -> Flood:
        self._stop.clear()
        self._thread = threading.Thread(target=self._send, daemon=True)
        self._thread.start()
        compiler = self.engine.grammars.compiler
        while compiler.threads() < 2:  # acme's share of the workers busy
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _send(self) -> None:
        while not self._stop.is_set():
            n = len(self.sent)
            self.sent.append(f"acme{n}")
            params = SamplingParams(max_tokens=60, temperature=0.0)
            request = GenerateRequest(self.sent[-1], PROMPT, params, cache_salt="acme",
                                      response_format=response_format(costly(n)))  # fmt: skip
            self.engine.submit(request, lambda out: None)
            time.sleep(0.05)

    def quiet(self) -> None:
        """acme's requests all aborted, and no compile running."""
        for rid in self.sent:
            self.engine.abort(rid)
        compiler = self.engine.grammars.compiler
        while compiler.threads():
            time.sleep(0.01)


def both(engine: Engine, tag: str) -> tuple[float, float]:
    """Seconds of globex's plain completion, then of initech's small structured request."""
    plain = GenerateRequest(f"g{tag}", PROMPT, cache_salt="globex",
                            sampling=SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True))  # fmt: skip
    small = GenerateRequest(f"i{tag}", PROMPT, SamplingParams(max_tokens=60, temperature=0.0),
                            cache_salt="initech", response_format=response_format(SMALL | {"title": tag}))  # fmt: skip
    return timed(engine, plain), timed(engine, small)


def run(engine: Engine, rounds: int, tag: str) -> tuple[float, float]:
    """(plain, structured): loaded median over alone median, over rounds alternated phases."""
    flood = Flood(engine)
    alone, loaded = [], []
    for r in range(rounds):
        for phase in ("alone", "loaded") if r % 2 == 0 else ("loaded", "alone"):
            if phase == "alone":
                flood.quiet()
                alone += [both(engine, f"{tag}a{r}.{i}") for i in range(SAMPLES)]
            else:
                with flood:
                    loaded += [both(engine, f"{tag}l{r}.{i}") for i in range(SAMPLES)]
    flood.quiet()
    ratios = []
    for k, what in enumerate(("plain", "structured")):
        before = statistics.median(a[k] for a in alone)
        after = statistics.median(b[k] for b in loaded)
        print(f"  {tag} {what}: alone {1e3 * before:.0f} ms, flooded {1e3 * after:.0f} ms, "
              f"{after / before:.2f}x ({len(alone)} samples each; acme sent {len(flood.sent)})")  # fmt: skip
        ratios.append(after / before)
    return ratios[0], ratios[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--rounds", type=int, default=16, help="alone/flooded phase pairs per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--kit", type=Path, default=DEMO, help="the demo kit's folder")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f}\n")
    base = load_model(args.kit / "base", quantization="none")
    config = EngineConfig(max_model_len=2048, num_blocks=2048, block_size=16,
                          scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096))  # fmt: skip
    engine = Engine(base.model, base.tokenizer, config)
    engine.start()
    try:
        for i in range(3):  # warm-up: the processes, the vocabulary, the first steps
            both(engine, f"warm{i}")
        runs = [run(engine, args.rounds, f"run{i}") for i in range(args.runs)]
    finally:
        engine.shutdown()
    middle = [statistics.median(r[k] for r in runs) for k in range(2)]
    print(f"\n| request | flooded / alone (middle of {args.runs} runs) | target |")
    print("|---|---:|---:|")
    for what, ratio in zip(("globex plain completion", "initech small structured"), middle):
        print(f"| {what} | {ratio:.2f}x | 1.2x |")


if __name__ == "__main__":
    main()
