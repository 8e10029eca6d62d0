"""vLLM peer: run with the python of the vLLM venv (see venvs.py), not the main venv.

    python bench/peers/vllm_worker.py --model DIR --adapters NAME=DIR,NAME=DIR \
        --prompts FILE.json --max-tokens 64 --max-lora-rank 16 --max-loras N [--dtype float32]

FILE.json: [{"prompt_token_ids": [...], "adapter": NAME or null}, ...]
Prints one JSON line on stdout:
    {"seconds": ..., "output_tokens": ..., "outputs": [[ids], ...], ...}
All vLLM logging goes to stderr. Environment defaults set here (overridable):
HF_HUB_OFFLINE=1, VLLM_CPU_KVCACHE_SPACE=1 (GiB), VLLM_CACHE_ROOT=.bench-venvs/vllm-cache,
VLLM_CONFIGURE_LOGGING / VLLM_LOGGING_STREAM sent to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def _env_defaults() -> None:
    # Both cores, like the other engines (vLLM otherwise drops to one thread on 2 cores).
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(Path(".bench-venvs/vllm-cache").absolute()))
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def parse_adapters(spec: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"--adapters item {item!r} is not NAME=DIR")
        out[name] = str(Path(path).absolute())
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapters", default="")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-lora-rank", type=int, default=16)
    ap.add_argument("--max-loras", type=int, default=None)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=None)
    ap.add_argument(
        "--no-spare-lora-slot",
        action="store_true",
        help="do not add the spare LoRA slot that works around vLLM-CPU applying the "
        "last slot's adapter to no-LoRA requests in mixed batches",
    )
    a = ap.parse_args(argv)
    _env_defaults()
    # vLLM (and its engine subprocess) print to stdout; keep stdout for the one JSON line.
    sys.stdout.flush()
    real_stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    t_start = time.perf_counter()
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    adapters = parse_adapters(a.adapters)
    items = json.loads(Path(a.prompts).read_text())
    max_len = a.max_model_len or (
        max(len(it["prompt_token_ids"]) for it in items) + a.max_tokens + 16
    )

    kw: dict = dict(
        model=str(Path(a.model).absolute()),
        dtype=a.dtype,
        enforce_eager=True,
        max_model_len=max_len,
        seed=0,
    )
    if a.max_num_seqs:
        kw["max_num_seqs"] = a.max_num_seqs
    max_loras = a.max_loras or len(adapters)
    # vLLM's CPU LoRA ops (vllm/lora/ops/torch_ops/lora_ops.py, bgmv_*) index the stacked
    # adapter weights with the per-token slot index, and a no-LoRA token has index -1, i.e.
    # Python's *last* slot: in a batch mixing base and LoRA requests the base requests get
    # the adapter in slot max_loras-1 (seen in vllm-cpu 0.32.0). One spare slot that is
    # never filled keeps them on zero weights.
    spare = (
        bool(adapters)
        and not a.no_spare_lora_slot
        and any(it.get("adapter") is None for it in items)
    )
    if spare:
        max_loras = min(max_loras, len(adapters)) + 1
    if adapters:
        kw.update(enable_lora=True, max_lora_rank=a.max_lora_rank, max_loras=max_loras)
    llm = LLM(**kw)
    t_ready = time.perf_counter()

    ids = {name: i + 1 for i, name in enumerate(adapters)}  # lora_int_id must be >= 1
    reqs = {name: LoRARequest(name, ids[name], path) for name, path in adapters.items()}
    prompts = [{"prompt_token_ids": list(it["prompt_token_ids"])} for it in items]
    loras = []
    for it in items:
        name = it.get("adapter")
        if name is not None and name not in reqs:
            raise SystemExit(f"prompt names adapter {name!r}, not given in --adapters")
        loras.append(reqs[name] if name is not None else None)
    sp = SamplingParams(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=True)

    # Warm-up: one short request per distinct adapter (loads the LoRA weights) and the base.
    warm_names = sorted({it.get("adapter") for it in items}, key=lambda x: (x is not None, x or ""))
    warm_p = [{"prompt_token_ids": prompts[0]["prompt_token_ids"]} for _ in warm_names]
    warm_l = [reqs[n] if n is not None else None for n in warm_names]
    llm.generate(
        warm_p,
        SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True),
        lora_request=warm_l if adapters else None,
        use_tqdm=False,
    )

    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, lora_request=loras if adapters else None, use_tqdm=False)
    seconds = time.perf_counter() - t0
    out_ids = [list(o.outputs[0].token_ids) for o in outs]
    rec = {
        "seconds": seconds,
        "output_tokens": sum(len(x) for x in out_ids),
        "outputs": out_ids,
        "startup_seconds": round(t_ready - t_start, 2),
        "vllm_version": vllm.__version__,
        "dtype": a.dtype,
        "max_loras": max_loras if adapters else 0,
        "spare_lora_slot": spare,
    }
    real_stdout.write(json.dumps(rec) + "\n")
    real_stdout.flush()
    del llm  # shut the engine down before exit


if __name__ == "__main__":
    main()
