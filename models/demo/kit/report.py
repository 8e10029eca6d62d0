"""The build's figures: evaluation prompts, summaries, threshold checks and the printed table."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table
from tokenizers import Tokenizer

from .tokenizer import render_chat
from .train import TrainLog
from .transforms import Transform, measure_effect

# What a full build must reach. CPU numerics vary between machines, so these are floors
# with room, not the figures of one run (those are in metrics.json and the card).
MAX_BASE_VAL_LOSS = 4.2
MAX_DRAFT_VAL_LOSS = 5.0
MAX_FP8_PPL_CHANGE = 0.02  # relative
MIN_ACCEPTANCE = 0.45  # greedy, k=4, no adapter
MIN_EFFECT_GAIN = 0.2  # an adapter's share above the base model's


def eval_prompts(tok: Tokenizer, val_texts, val_pairs, count: int) -> list[list[int]]:
    """Half raw prompts (a held-out function's first line), half chat questions."""
    raw: list[str] = []
    for text in val_texts:
        line = next((ln for ln in text.split("\n") if ln.startswith("def ")), None)
        if line:
            raw.append(line + "\n")
    chats = [render_chat([{"role": "user", "content": q}], True) for q, _ in val_pairs]
    n_raw = count // 2
    picked = raw[:n_raw] + chats[: count - n_raw]
    return [tok.encode(p).ids for p in picked]


def log_summary(log: TrainLog) -> dict:
    return {"steps": log.losses[-1][0] + 1, "seconds": round(log.seconds, 1), "tokens": log.tokens,
            "tokens_per_second": round(log.tokens / max(log.seconds, 1e-9)),
            "first_loss": log.losses[0][1], "final_loss": log.final_loss,
            "losses": [[s, round(v, 4)] for s, v in log.losses]}  # fmt: skip


def effect(t: Transform, tok: Tokenizer, base_out, adapter_out, known) -> dict:
    """The transform's measure on the base model's and the adapter's greedy outputs."""

    def mean(outputs) -> float:
        return sum(measure_effect(t.measure, tok.decode(o), known) for o in outputs) / len(outputs)

    return {"measure": t.measure, "base": mean(base_out), "adapter": mean(adapter_out),
            "threshold": t.threshold}  # fmt: skip


def check(metrics: dict) -> list[str]:
    """Every threshold the figures miss, as one line each."""
    failures = []
    v = metrics["val_loss"]
    if v["base"] > MAX_BASE_VAL_LOSS:
        failures.append(f"base validation loss {v['base']:.3f} > {MAX_BASE_VAL_LOSS}")
    if v["draft"] > MAX_DRAFT_VAL_LOSS:
        failures.append(f"draft validation loss {v['draft']:.3f} > {MAX_DRAFT_VAL_LOSS}")
    change = math.exp(v["base_fp8"] - v["base"]) - 1
    if abs(change) > MAX_FP8_PPL_CHANGE:
        failures.append(f"FP8 perplexity change {change:+.2%} beyond {MAX_FP8_PPL_CHANGE:.0%}")
    rate = metrics["acceptance"]["none"]["acceptance_rate"]
    if rate < MIN_ACCEPTANCE:
        failures.append(f"draft acceptance {rate:.2f} < {MIN_ACCEPTANCE}")
    for name, e in metrics["effects"].items():
        if e["adapter"] < e["threshold"] or e["adapter"] < e["base"] + MIN_EFFECT_GAIN:
            failures.append(f"adapter {name}: {e['measure']} {e['adapter']:.2f} "
                            f"(base {e['base']:.2f}, needs {e['threshold']})")  # fmt: skip
    return failures


def print_summary(metrics: dict) -> None:
    console = Console()
    v = metrics["val_loss"]
    console.print(
        f"parameters: base {metrics['parameters']['base']:,}, draft {metrics['parameters']['draft']:,}"
    )
    console.print(f"validation loss: base {v['base']:.3f}, draft {v['draft']:.3f}, "
                  f"base FP8 {v['base_fp8']:.3f} (perplexity {math.exp(v['base_fp8'] - v['base']) - 1:+.2%})")  # fmt: skip
    table = Table(
        "adapter", "measure", "base", "adapter", "accept (base draft)", "accept (companion)"
    )
    a = metrics["acceptance"]
    table.add_row(
        "none",
        "",
        "",
        "",
        f"{a['none']['acceptance_rate']:.2f} ({a['none']['tokens_per_step']:.2f} tok/step)",
        "",
    )
    for name, e in metrics["effects"].items():
        if name not in a:  # an adapter without a draft companion (tools)
            table.add_row(name, e["measure"], f"{e['base']:.2f}", f"{e['adapter']:.2f}", "", "")
            continue
        b, c = a[name]["base_draft"], a[name]["companion"]
        table.add_row(name, e["measure"], f"{e['base']:.2f}", f"{e['adapter']:.2f}",
                      f"{b['acceptance_rate']:.2f} ({b['tokens_per_step']:.2f})",
                      f"{c['acceptance_rate']:.2f} ({c['tokens_per_step']:.2f})")  # fmt: skip
    console.print(table)
    console.print(f"built in {metrics.get('build_seconds', 0):.0f} s")
