"""Schema compile cost: measured seconds beside cost.py's estimate, to re-fit its constants.

    python -m bench.grammar_cost [--quick] [--timeout 30] [--repeats 3] [--kit models/demo]

About 6 minutes on 2 cores; --quick (a few shapes, once each) about 20 s.

Each shape (a pattern's narrow or wide repeats, nested repeats, patterns summed over an
object, objects of many optional or required properties, strict or not: an object that
allows properties it does not name costs more) compiles as the server compiles it, in a
compile process (serving/engine/grammar/process.py: one thread, the lowest CPU priority,
the result serialized back) against the demo kit's vocabulary, after a small compile in
the same process. A shape still compiling after --timeout seconds is stopped (its process
killed) and skipped. `cpu s` is the process's CPU time for the compile (median of
--repeats), which the host's other load inflates far less than the wall time (`wall s`, of
the last repeat). `estimate / cpu` above 1: cost.py overestimates, and refuses schemas that
would compile within the budget; below 1: it underestimates, and only the compile time limit
stops the schema. Rows marked `*` are near the budget (the estimate or the measured time
within 4x of MAX_COMPILE_S either way, or past the timeout), where refusals are decided;
the last lines sum them up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from serving.engine.grammar.compiler import _make_tokenizer_info
from serving.engine.grammar.cost import MAX_COMPILE_S, costly_parts
from serving.engine.grammar.formats import prepared
from serving.engine.grammar.process import CompileProcess
from serving.model.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo"
WARM_UP = {"type": "string", "maxLength": 8}  # compiled first in each new process
TICK = os.sysconf("SC_CLK_TCK")  # /proc's unit of CPU time


def pattern(regex: str) -> dict:
    """A string that is all regex."""
    return {"type": "string", "pattern": f"^{regex}$"}


def patterns(regex: str, k: int) -> dict:
    """An object of k properties, each a string of regex: k patterns, their costs summed."""
    return {"type": "object", "properties": {f"p{i}": pattern(regex) for i in range(k)}}


def properties(n: int, required: int) -> dict:
    """An object of n string properties, the first `required` of them required."""
    names = [f"field_{i}" for i in range(n)]
    return {"type": "object", "properties": {name: {"type": "string"} for name in names},
            "required": names[:required]}  # fmt: skip


# (quick, full) sizes of each kind of shape
NARROW = ((1000, 4000), (250, 1000, 2000, 4000, 8000))  # [a-z]{1,N}
WIDE = ((1000, 2000), (250, 500, 1000, 2000, 3000))  # .{1,N}
NESTED = (  # variable repeats inside repeats, of wide classes and narrow ones
    ("(.{1,10}){1,3}", "(.{1,100}){1,2}", "([a-z]{1,10}){1,50}"),
    ("(.{1,10}){1,2}", "(.{1,10}){1,4}", "(.{1,20}){1,3}", "(.{1,50}){1,2}", "(.{1,100}){1,2}",
     "(.{1,100}){1,3}", "([^,]{1,100},){1,5}", "([a-z]{1,10}){1,25}", "([a-z]{1,10}){1,50}",
     "([a-z]{1,10}){1,100}", r"(\w{1,20} ?){1,50}", "([a-z]{1,5}){1,25}", "([a-z]{1,40}){1,25}",
     "([a-z]{5,10}){1,25}", "([a-z]{10}){1,50}", "([a-z]{1,10} ){1,50}", r"(\w{1,10} ?){1,25}",
     "(.{1,10}){1,10}", "(.{1,10}){1,25}", "(.{1,50}){1,5}"),
)  # fmt: skip
SUMMED = ((6,), (2, 4, 6, 8))  # k patterns .{1,1000} in one object
OPTIONAL = ((100, 1000), (100, 300, 600, 1000))  # n properties, none required
REQUIRED = ((300,), (100, 300, 600))  # n properties, all required
# not strict (properties it does not name allowed): SUMMED, OPTIONAL, REQUIRED
LOOSE = (((6,), (100,), (100,)), ((6,), (100, 300), (100, 300)))


def shapes(quick: bool) -> dict[str, tuple[dict, bool]]:
    """name -> (schema, strict); quick: a few of each kind, in seconds (one past 5 s)."""
    size = 0 if quick else 1
    regexes = [f"[a-z]{{1,{n}}}" for n in NARROW[size]] + [f".{{1,{n}}}" for n in WIDE[size]]
    if not quick:  # other wide classes
        regexes += [f"{c}{{1,{n}}}" for c in ("[^x]", r"\S", r"\w") for n in (500, 1000)]
    # a string is the same strict or not
    table = {regex: (pattern(regex), True) for regex in regexes + list(NESTED[size])}
    table |= objects(SUMMED[size], OPTIONAL[size], REQUIRED[size], strict=True)
    table |= objects(*LOOSE[size], strict=False)
    return table | (others(quick=True) if quick else others(quick=False))


def required(names) -> dict:
    """An object of these string properties, all required."""
    return {"type": "object", "properties": {n: {"type": "string"} for n in names},
            "required": list(names)}  # fmt: skip


def others(quick: bool) -> dict[str, tuple[dict, bool]]:
    """name -> (schema, strict) of the shapes the model counts other than by patterns:
    nested objects, references, branches, arrays, enums, string lengths."""
    inner = required([f"f{j}" for j in range(30)])
    outer = {"type": "object", "properties": {f"o{i}": inner for i in range(10)},
             "required": [f"o{i}" for i in range(10)]}  # fmt: skip
    refs = {"$defs": {"p": inner}, **outer,
            "properties": {f"o{i}": {"$ref": "#/$defs/p"} for i in range(10)}}  # fmt: skip
    table = {"10 objects x 30 properties": (outer, True),
             "10 objects x 30 properties, not strict": (outer, False)}  # fmt: skip
    if quick:
        return table
    values = [f"value_{i:04d}" for i in range(3000)]
    return table | {
        "$defs of 30 properties x 10 $refs": (refs, True),
        "anyOf 10 x 30 properties": ({"anyOf": [inner] * 10}, True),
        "array of 30 properties, minItems 20": ({"type": "array", "items": inner, "minItems": 20}, True),
        "enum of 3000 values": ({"enum": values}, True),
        "maxLength 3000": ({"type": "string", "maxLength": 3000}, True),
        "minLength 1000": ({"type": "string", "minLength": 1000}, True),
        "300 properties, additionalProperties false, not strict": (
            {**properties(300, 300), "additionalProperties": False}, False),
    }  # fmt: skip


def objects(summed, optional, required, strict: bool) -> dict[str, tuple[dict, bool]]:
    """name -> (schema, strict) of the object shapes of these sizes."""
    tail = "" if strict else ", not strict"
    table = {f"{k} x .{{1,1000}}{tail}": (patterns(".{1,1000}", k), strict) for k in summed}
    table |= {f"{n} properties, none required{tail}": (properties(n, 0), strict) for n in optional}  # fmt: skip
    return table | {f"{n} properties, all required{tail}": (properties(n, n), strict) for n in required}  # fmt: skip


def estimate(schema: dict, strict: bool) -> float:
    """cost.py's estimate of schema, as the compiler reads it."""
    return sum(part.seconds for part in costly_parts(prepared(schema), (), strict))


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Compiles:
    """Compiles in one process at a time; a new one after a compile is stopped."""

    def __init__(self, info: str):
        self._info, self._process = info, None

    def run(self, schema: dict, strict: bool, timeout: float) -> tuple[float, float] | None:
        """(CPU s, wall s) of one compile of schema; None when it ran past timeout."""
        if self._process is None:
            self._process = CompileProcess(self._info)
            if self._compile(WARM_UP, True, 60.0) is None:
                raise RuntimeError("the warm-up compile did not finish")
        return self._compile(schema, strict, timeout)

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process = None

    def _compile(self, schema: dict, strict: bool, timeout: float) -> tuple[float, float] | None:
        process = self._process
        cpu, wall = cpu_seconds(process.pid), time.perf_counter()
        process.compile(json.dumps(prepared(schema)), strict)
        reply = process.reply(timeout)
        if reply is None:
            self.close()
            return None
        if "error" in reply:
            raise RuntimeError(f"xgrammar refused a shape: {reply['error']}")
        return cpu_seconds(process.pid) - cpu, time.perf_counter() - wall


def rows(compiles: Compiles, table: dict, timeout: float, repeats: int) -> list[str]:
    """The table's lines, then the estimate / cpu ratios of the shapes near the budget."""
    out = ["| shape | estimate s | cpu s | wall s | estimate / cpu |", "|---|---:|---:|---:|---:|"]
    near, past = [], []  # ratios of shapes near the budget; shapes past the timeout
    for name, (schema, strict) in table.items():
        guess, runs = estimate(schema, strict), []
        while len(runs) < repeats and (measured := compiles.run(schema, strict, timeout)):
            runs.append(measured)
        if len(runs) < repeats:
            past.append(name)
            out.append(f"| {name} * | {guess:.3g} | past {timeout:g} s: skipped | | < {guess / timeout:.3g} |")  # fmt: skip
        else:
            cpu = statistics.median(r[0] for r in runs)
            ratio = guess / max(cpu, 1 / TICK)
            mark = " *" if _near(guess) or _near(cpu) else ""
            if mark:
                near.append(ratio)
            out.append(f"| {name}{mark} | {guess:.3g} | {cpu:.3g} | {runs[-1][1]:.3g} | {ratio:.3g} |")  # fmt: skip
        print(out[-1], file=sys.stderr, flush=True)  # progress: the table is printed at the end
    if near:
        out.append(f"\nnear the budget (*): estimate / cpu from {min(near):.3g} to "
                   f"{max(near):.3g}, median {statistics.median(near):.3g}")  # fmt: skip
    if past:
        out.append(f"past the timeout ({timeout:g} s): {'; '.join(past)}")
    return out


def _near(seconds: float) -> bool:
    """Within 4x of the budget either way: where a refusal is decided."""
    return MAX_COMPILE_S / 4 <= seconds <= MAX_COMPILE_S * 4


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="a few shapes, 1 repeat (a smoke run)")
    ap.add_argument("--timeout", type=float, help="seconds a shape may compile (30; quick 5)")
    ap.add_argument("--repeats", type=int, help="compiles per shape, median (3; quick 1)")
    ap.add_argument("--kit", type=Path, default=DEMO, help="the demo kit's folder")
    args = ap.parse_args(argv)
    timeout = args.timeout or (5.0 if args.quick else 30.0)
    repeats = args.repeats or (1 if args.quick else 3)
    tokenizer = load_tokenizer(args.kit / "base")
    vocab_size = json.loads((args.kit / "base" / "config.json").read_text())["vocab_size"]
    info = _make_tokenizer_info(tokenizer, vocab_size).serialize_json()
    print(f"vocabulary: {vocab_size} tokens ({args.kit}); budget {MAX_COMPILE_S:g} s; "
          f"medians of {repeats}, shapes past {timeout:g} s skipped\n")  # fmt: skip
    compiles = Compiles(info)
    try:
        print("\n".join(rows(compiles, shapes(args.quick), timeout, repeats)))
    finally:
        compiles.close()
    print(f"\nCommand: python -m bench.grammar_cost {' '.join(sys.argv[1:] if argv is None else argv)}")  # fmt: skip


if __name__ == "__main__":
    main()
