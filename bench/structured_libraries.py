"""xgrammar against llguidance, for bench/structured.py --libraries: masks per step and compiles.

Two tokenizers: the demo kit's (byte-level BPE, 4,096 ids) and a byte-level BPE of 32,000 ids
trained here on the standard library's sources (a few seconds), a common vocabulary size.

  masks     B rows follow the same JSON document (NESTED's) token by token; each step every
            row fills its row of a [B, V / 32] bitmask, then accepts the document's next
            token. xgrammar runs as the engine runs it (GrammarCompiler, RowGrammar,
            grammar_masks); llguidance fills row by row, and on 2 threads with its executor
            (fill_next_token_bitmask_par). Medians of interleaved rounds. Apply: the
            sampler's copy of [B, V] logits and TokenMasks.apply (the bitmask's format is the
            same whichever library filled it).
  compile   the vocabulary's setup (a fresh GrammarCompiler's first compile less a set-up
            one's; llguidance's LLTokenizer), then a format's grammar up to its first mask:
            xgrammar precompiles the tokens each grammar state allows, llguidance computes
            each mask when it is asked for.
"""

from __future__ import annotations

import glob
import json
import statistics
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

from bench.structured_workload import NESTED, SCHEMAS, response_format
from serving.engine.grammar.compiler import JSON_OBJECT, GrammarCompiler
from serving.engine.grammar.masks import TokenMasks, allocate, grammar_masks
from serving.engine.grammar.matcher import RowGrammar
from serving.model.tokenizer import Tokenizer

# In NESTED's property order: both libraries hold an object's properties to the schema's order.
DOCUMENT = {"name": "Jonathan Quincy Adams the third", "age": 42, "tags": ["alpha", "gamma"],
            "address": {"city": "Springfield of the North", "zip": "12345-6789"}}  # fmt: skip
LLG_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ROUNDS = 5


def trained_tokenizer(folder: Path, vocab_size: int = 32000) -> Tokenizer:
    """A byte-level BPE trained on the standard library's sources (tests and site-packages out)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    root = sysconfig.get_paths()["stdlib"]
    files = sorted(p for p in glob.glob(f"{root}/**/*.py", recursive=True)
                   if "site-packages" not in p and "/test" not in p)  # fmt: skip
    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    backend.train(files, trainer)
    backend.save(str(folder / "tokenizer.json"))
    return Tokenizer(backend, {"eos_token": "<eos>"})


def llg_tokenizer(tok: Tokenizer):
    import llguidance

    return llguidance.LLTokenizer(tok.to_json(), eos_token=list(tok.eos_token_ids))


def llg_grammar(fmt) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(fmt.schema or JSON_OBJECT, LLG_OPTIONS)


def mask_ms(tok: Tokenizer, vocab_size: int, batches: list[int]) -> list[dict]:
    """Per batch: ms per step of each library's fill and accepts, and of applying its masks."""
    import llguidance
    import llguidance.torch as llt

    fmt = response_format(NESTED)
    compiler = GrammarCompiler(tok, vocab_size)
    compiled = compiler.compile_now(fmt)
    ll_tok, grammar = llg_tokenizer(tok), llg_grammar(fmt)
    executor = llguidance.LLExecutor(2)
    ids = tok.encode(json.dumps(DOCUMENT), add_special_tokens=False)

    def xgr(b):
        rows = [RowGrammar(compiled) for _ in range(b)]
        return lambda: grammar_masks(rows), lambda t: [r.accept(t) for r in rows]

    def llg(b, parallel=False):
        rows = [llguidance.LLMatcher(ll_tok, grammar) for _ in range(b)]

        def fill():
            bitmask = allocate(b, ll_tok.vocab_size)
            if parallel:
                llt.fill_next_token_bitmask_par(executor, list(zip(rows, range(b))), bitmask)
            else:
                for i, m in enumerate(rows):
                    llt.fill_next_token_bitmask(m, bitmask, i)
            return TokenMasks(bitmask, tuple(range(b)))

        return fill, lambda t: [m.consume_token(t) for m in rows]

    def follow(make, logits) -> dict[str, float]:
        """ms per step of fill, accept and apply (the sampler's copy of the logits + apply)."""
        fill, accept = make()
        spent = dict.fromkeys(("fill", "accept", "apply"), 0.0)
        for t in ids:
            t0 = time.perf_counter()
            masks = fill()
            t1 = time.perf_counter()
            masks.apply(logits.clone())
            t2 = time.perf_counter()
            if not all(accept(t)):
                raise RuntimeError(f"the grammar refused token {t} of the document")
            spent["fill"] += t1 - t0
            spent["apply"] += t2 - t1
            spent["accept"] += time.perf_counter() - t2
        return {k: v / len(ids) * 1e3 for k, v in spent.items()}

    rows = []
    for b in batches:
        makers = {"xgrammar": lambda b=b: xgr(b), "llguidance": lambda b=b: llg(b),
                  "llguidance 2 threads": lambda b=b: llg(b, parallel=True)}  # fmt: skip
        logits = torch.randn(b, vocab_size)
        samples: dict[str, list[dict]] = {name: [] for name in makers}
        for _ in range(ROUNDS):
            for name, make in makers.items():
                samples[name].append(follow(make, logits))
        row = {"batch": b, "tokens": len(ids)}
        for name, s in samples.items():
            for part in ("fill", "accept", "apply"):
                row[f"{name} {part}"] = statistics.median(x[part] for x in s)
        rows.append(row)
    compiler.shutdown()
    return rows


def compile_ms(tok: Tokenizer, vocab_size: int) -> list[dict]:
    """Per format: each library's vocabulary setup, and its compile up to the first mask (ms)."""
    import llguidance
    import llguidance.torch as llt

    warm_up = response_format({"type": "string"})
    rows = []
    for name, schema in {**SCHEMAS, "json_object": None}.items():
        fmt = response_format(schema)
        times: dict[str, list[float]] = {k: [] for k in ("xgr setup", "xgr", "llg setup", "llg")}
        for _ in range(ROUNDS):
            fresh, ready = GrammarCompiler(tok, vocab_size), GrammarCompiler(tok, vocab_size)
            ready.compile_now(warm_up)
            t0 = time.perf_counter()
            fresh.compile_now(fmt)  # the vocabulary's setup, then the grammar
            t1 = time.perf_counter()
            compiled = ready.compile_now(fmt)
            t2 = time.perf_counter()
            grammar_masks([RowGrammar(compiled)])
            t3 = time.perf_counter()
            ll_tok = llg_tokenizer(tok)
            t4 = time.perf_counter()
            m = llguidance.LLMatcher(ll_tok, llg_grammar(fmt))
            llt.fill_next_token_bitmask(m, allocate(1, ll_tok.vocab_size), 0)
            t5 = time.perf_counter()
            if m.is_error():
                raise RuntimeError(f"llguidance refused {name}: {m.get_error()}")
            times["xgr setup"].append((t1 - t0) - (t2 - t1))
            times["xgr"].append(t3 - t1)
            times["llg setup"].append(t4 - t3)
            times["llg"].append(t5 - t4)
            fresh.shutdown()
            ready.shutdown()
        rows.append({"format": name, **{k: 1e3 * statistics.median(v) for k, v in times.items()}})
    return rows


def library_rows(demo: Tokenizer, demo_vocab: int, quick: bool = False) -> list[str]:
    try:
        import llguidance  # noqa: F401
    except ImportError:
        return ["llguidance is not installed (it is no dependency of loraserve): "
                "`pip install llguidance` to compare it"]  # fmt: skip
    batches = [1, 8] if quick else [1, 8, 32]
    tokenizers, out = {f"demo ({demo_vocab})": (demo, demo_vocab)}, []
    with tempfile.TemporaryDirectory() as tmp:
        if not quick:  # (a quick run: the demo's vocabulary alone, no tokenizer to train)
            start = time.perf_counter()
            big = trained_tokenizer(Path(tmp), 32000)
            out = [f"(the {big.vocab_size}-id BPE trained in {time.perf_counter() - start:.1f} s)", ""]  # fmt: skip
            tokenizers[f"stdlib BPE ({big.vocab_size})"] = (big, big.vocab_size)
        masks = {label: mask_ms(t, v, batches) for label, (t, v) in tokenizers.items()}
        compiles = {label: compile_ms(t, v) for label, (t, v) in tokenizers.items()}
    out += ["| tokenizer | batch | document tokens | xgrammar fill ms/step | llguidance fill ms/step "
           "| llguidance 2 threads ms/step | llguidance / xgrammar | xgrammar accept ms/step "
           "| llguidance accept ms/step | apply ms/step |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for label, rows in masks.items():
        for r in rows:
            x, ll, par = (
                r[f"{n} fill"] for n in ("xgrammar", "llguidance", "llguidance 2 threads")
            )
            out.append(
                f"| {label} | {r['batch']} | {r['tokens']} | {x:.3f} | {ll:.3f} | {par:.3f} "
                f"| {ll / x:.1f}x | {r['xgrammar accept']:.3f} | {r['llguidance accept']:.3f} "
                f"| {r['xgrammar apply']:.3f} |"
            )
    out += ["", "| tokenizer | format | xgrammar setup ms | xgrammar compile + first mask ms "
            "| llguidance setup ms | llguidance compile + first mask ms |",
            "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for label, rows in compiles.items():
        for r in rows:
            out.append(f"| {label} | {r['format']} | {r['xgr setup']:.1f} | {r['xgr']:.1f} "
                       f"| {r['llg setup']:.1f} | {r['llg']:.2f} |")  # fmt: skip
    return out
