"""Build the demo kit: tokenizer, base model, draft model and four LoRA adapters.

    python models/demo/build.py                # the committed kit, into models/demo (~50 min, 2 cores)
    python models/demo/build.py --smoke --out /tmp/kit   # every stage, a few steps each
    python models/demo/build.py --only-tools   # the tools adapter alone, on the kit's base

Fixed seeds and step counts make it reproducible up to CPU numerics; the results are
checked against thresholds, not exact values, and written to metrics.json.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # rich shows the build's progress

import warnings

import torch
import typer
from tokenizers import Tokenizer
from transformers import LlamaForCausalLM
from transformers.utils import logging as hf_logging

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the kit/ steps beside this script
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for kernels.fp8

from kit import corpus as corpus_mod
from kit import data, evaluate, report, train
from kit.models import (
    DEFAULT_SHAPE,
    Shape,
    new_base,
    new_draft,
    parameter_count,
    save_adapter,
    save_model,
    with_lora,
)
from kit.tokenizer import save_tokenizer, stop_ids, train_tokenizer
from kit.tool_calls import ToolExamples, call_accuracy
from kit.transforms import TRANSFORMS, known_words

# The committed kit's schedules: fixed step counts, so a rebuild repeats the same work.
BASE_TRAINING = train.Schedule(steps=1400, batch=16, seq=256, lr=2e-3)
DRAFT_TRAINING = train.Schedule(steps=700, batch=16, seq=256, lr=2e-3)
ADAPTER_TRAINING = train.Schedule(steps=400, batch=8, seq=192, lr=2e-3, warmup=20, weight_decay=0.0)
COMPANION_TRAINING = train.Schedule(
    steps=250, batch=8, seq=192, lr=2e-3, warmup=20, weight_decay=0.0
)
# the tools adapter's examples list up to three functions' schemas: longer rows
TOOLS_TRAINING = train.Schedule(steps=600, batch=8, seq=384, lr=2e-3, warmup=20, weight_decay=0.0)
TOOLS_THRESHOLD = 0.8  # share of held-out requests answered with exactly the wanted call
DEMO_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Plan:
    """Every size and step count of a build."""

    vocab: int = 4096
    shape: Shape = DEFAULT_SHAPE
    draft_layers: int = 1
    base: train.Schedule = BASE_TRAINING
    draft: train.Schedule = DRAFT_TRAINING
    adapter: train.Schedule = ADAPTER_TRAINING
    draft_adapter: train.Schedule = COMPANION_TRAINING
    tools: train.Schedule = TOOLS_TRAINING
    tool_evals: int = 40
    rank: int = 8
    chat_rows: int = 2  # rows of each base/draft batch drawn from the chat conversations
    val_windows: int = 96
    eval_prompts: int = 8
    eval_tokens: int = 48
    spec_k: int = 4
    max_files: int | None = None
    check: bool = True  # smoke builds report their figures without judging them


SMOKE = Plan(
    vocab=600,
    shape=Shape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, max_len=512),
    base=train.Schedule(steps=3, batch=4, seq=64, lr=1e-3, warmup=1),
    draft=train.Schedule(steps=2, batch=4, seq=64, lr=1e-3, warmup=1),
    adapter=train.Schedule(steps=2, batch=2, seq=64, lr=1e-3, warmup=1),
    draft_adapter=train.Schedule(steps=2, batch=2, seq=64, lr=1e-3, warmup=1),
    tools=train.Schedule(steps=2, batch=2, seq=384, lr=1e-3, warmup=1),
    tool_evals=2,
    chat_rows=1,
    val_windows=4,
    eval_prompts=2,
    eval_tokens=6,
    max_files=40,
    check=False,
)

app = typer.Typer(add_completion=False)


@app.command()
def main(
    out: Path = typer.Option(DEMO_DIR, help="where the kit is written"),
    smoke: bool = typer.Option(False, help="a few steps of every stage, to check the script"),
    reuse_models: bool = typer.Option(
        False, help="keep the base and draft already under --out; retrain only the adapters"
    ),
    seed: int = typer.Option(0, help="seed of every random choice"),
    threads: int = typer.Option(2, help="torch CPU threads"),
    only_tools: bool = typer.Option(
        False,
        help="train only the tools adapter on the base under --out (and write the "
        "chat template); the rest of metrics.json is kept",
    ),
) -> None:
    torch.set_num_threads(threads)
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings(
        "ignore", message="Could not find a config file"
    )  # PEFT, on a path base
    plan = SMOKE if smoke else Plan()
    started = time.perf_counter()
    if only_tools:
        metrics = json.loads((out / "metrics.json").read_text())
        add_tools_adapter(plan, out, LlamaForCausalLM.from_pretrained(out / "base").eval(),
                          Tokenizer.from_file(str(out / "base" / "tokenizer.json")), seed, metrics)  # fmt: skip
    else:
        metrics = build(plan, out, seed, reuse_models)
        metrics["build_seconds"] = round(time.perf_counter() - started, 1)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    report.print_summary(metrics)
    failures = report.check(metrics) if plan.check else []
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    raise typer.Exit(1 if failures else 0)


def build(plan: Plan, out: Path, seed: int, reuse_models: bool = False) -> dict:
    """Train and save every part of the kit under out; return the figures for the card."""
    text = corpus_mod.load_corpus(max_files=plan.max_files)
    pairs = corpus_mod.chat_pairs(text.train)
    val_pairs = corpus_mod.chat_pairs(text.val)
    print(f"corpus: {len(text.train)} train files ({text.train_chars:,} chars), "
          f"{len(text.val)} validation files, {len(pairs)} documented functions")  # fmt: skip
    if reuse_models:
        tok = Tokenizer.from_file(str(out / "base" / "tokenizer.json"))
    else:
        tok = train_tokenizer(text.train, plan.vocab)
    stream = data.token_stream(tok, text.train)
    chat_stream = data.token_stream(tok, data.chat_texts(pairs))
    val = data.fixed_windows(data.token_stream(tok, text.val), plan.val_windows, plan.base.seq)
    gen = torch.Generator().manual_seed(seed)

    def lm_batch(schedule: train.Schedule) -> torch.Tensor:
        rows = schedule.batch - plan.chat_rows
        return torch.cat([data.windows(stream, gen, rows, schedule.seq),
                          data.windows(chat_stream, gen, plan.chat_rows, schedule.seq)])  # fmt: skip

    if reuse_models:
        base = LlamaForCausalLM.from_pretrained(out / "base").eval()
        draft = LlamaForCausalLM.from_pretrained(out / "draft").eval()
        before = json.loads((out / "metrics.json").read_text())["training"]
        logs = {k: before[k] for k in ("base", "draft")}
    else:
        base = new_base(tok, plan.shape, seed)
        base.train()
        base_log = train.train("base", base.parameters(), plan.base,
                               lambda _: train.next_token_loss(base, lm_batch(plan.base)))  # fmt: skip
        base.eval()
        draft = new_draft(base, plan.draft_layers)
        draft.train()
        draft_log = train.train("draft", draft.parameters(), plan.draft,
                                lambda _: train.distill_loss(draft, base, lm_batch(plan.draft)))  # fmt: skip
        draft.eval()
        save_model(base, tok, out / "base")
        save_model(draft, tok, out / "draft")
        logs = {log.label: report.log_summary(log) for log in (base_log, draft_log)}

    known = known_words(text.train)
    prompts = report.eval_prompts(tok, text.val, val_pairs, plan.eval_prompts)
    stops = tuple(stop_ids(tok))
    metrics: dict = {
        "python": platform.python_version(),
        "corpus": {
            "license": corpus_mod.LICENSE,
            "train_files": len(text.train),
            "val_files": len(text.val),
            "train_chars": text.train_chars,
            "train_tokens": int(stream.numel()),
            "chat_pairs": len(pairs),
        },
        "plan": asdict(plan),
        "parameters": {"base": parameter_count(base), "draft": parameter_count(draft)},
        "training": logs,
        "val_loss": {
            "base": evaluate.val_loss(base, val),
            "draft": evaluate.val_loss(draft, val),
            "base_fp8": evaluate.val_loss(evaluate.fp8_round_trip(base), val),
        },
        "acceptance": {
            "none": evaluate.acceptance(base, draft, prompts, plan.spec_k, plan.eval_tokens)
        },
        "effects": {},
        "samples": {},
    }
    base_outputs = [evaluate.greedy(base, p, plan.eval_tokens, 1.2, stops) for p in prompts]
    for t in TRANSFORMS:
        examples = data.TransformExamples(tok, text.train, pairs, t.apply, seed)
        adapted = train_adapter(f"adapter {t.name}", base, examples, plan.adapter, plan.rank, seed)
        examples = data.TransformExamples(tok, text.train, pairs, t.apply, seed + 1)
        companion = train_adapter(
            f"draft companion {t.name}", draft, examples, plan.draft_adapter, plan.rank, seed
        )
        save_adapter(adapted.model, out / "adapters" / t.name, "models/demo/base")
        save_adapter(companion.model, out / "adapters" / t.name / "draft", "models/demo/draft")
        outputs = [evaluate.greedy(adapted.model, p, plan.eval_tokens, 1.2, stops) for p in prompts]
        metrics["training"][adapted.log.label] = report.log_summary(adapted.log)
        metrics["training"][companion.log.label] = report.log_summary(companion.log)
        metrics["effects"][t.name] = report.effect(t, tok, base_outputs, outputs, known)
        k, n = plan.spec_k, plan.eval_tokens
        metrics["acceptance"][t.name] = {
            "base_draft": evaluate.acceptance(adapted.model, draft, prompts, k, n),
            "companion": evaluate.acceptance(adapted.model, companion.model, prompts, k, n),
        }
        metrics["samples"][t.name] = tok.decode(outputs[-1])
    metrics["samples"]["base"] = tok.decode(base_outputs[-1])
    metrics["samples"]["prompt"] = tok.decode(prompts[-1])
    add_tools_adapter(plan, out, base, tok, seed, metrics)
    return metrics


def add_tools_adapter(
    plan: Plan, out: Path, base, tok: Tokenizer, seed: int, metrics: dict
) -> None:
    """Train the tools adapter on base, save it, and put its figures into metrics; the kit's
    tokenizer files are written again, so their chat template is the one it learnt."""
    adapted = train_adapter("adapter tools", base, ToolExamples(tok, seed), plan.tools, plan.rank,
                            seed)  # fmt: skip
    save_adapter(adapted.model, out / "adapters" / "tools", "models/demo/base")
    for part in ("base", "draft"):
        save_tokenizer(tok, out / part, base.config.max_position_embeddings)
    stops = tuple(stop_ids(tok))

    def accuracy(model) -> float:  # held-out requests: another seed than training's
        return call_accuracy(lambda p: evaluate.greedy(model, p, 60, 1.0, stops), tok, seed + 7,
                             plan.tool_evals)  # fmt: skip

    metrics["training"][adapted.log.label] = report.log_summary(adapted.log)
    metrics["effects"]["tools"] = {"measure": "call_accuracy", "base": accuracy(base),
                                   "adapter": accuracy(adapted.model),
                                   "threshold": TOOLS_THRESHOLD}  # fmt: skip


@dataclass(frozen=True)
class Trained:
    model: object  # a PEFT model, in eval mode
    log: train.TrainLog


def train_adapter(
    label, model, examples, schedule: train.Schedule, rank: int, seed: int
) -> Trained:
    """A rank-`rank` LoRA on a copy of model, trained on examples' masked continuations."""
    adapted = with_lora(model, rank, seed)
    adapted.train()

    def loss(_step: int):
        return train.next_token_loss(adapted, *examples.batch(schedule.batch, schedule.seq))

    log = train.train(label, adapted.parameters(), schedule, loss)
    return Trained(adapted.eval(), log)


if __name__ == "__main__":
    app()
