"""HF transformers + PEFT peer: one mixed-batch greedy `generate(adapter_names=...)` per batch.

Run with the peer's own virtualenv's python (see bench/engine.py):
    python bench/peers/hf_worker.py --model DIR --adapters a=DIR,b=DIR --prompts FILE.json
        --max-tokens 64 [--batch-size 32]
FILE.json: [{"prompt_token_ids": [...], "adapter": name or null}, ...]. Prints one JSON line:
{"seconds", "output_tokens", "outputs"} (generate's wall time over all batches, after a warm-up).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--adapters", default="")
    p.add_argument("--prompts", required=True)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32).eval()
    adapters = dict(a.split("=", 1) for a in args.adapters.split(",") if a)
    for i, (name, path) in enumerate(adapters.items()):
        if i == 0:
            model = PeftModel.from_pretrained(model, path, adapter_name=name)
        else:
            model.load_adapter(path, adapter_name=name)
    prompts = json.loads(Path(args.prompts).read_text())
    run(model, prompts[: args.batch_size], 4, bool(adapters))  # warm-up
    start = time.perf_counter()
    outputs = []
    for i in range(0, len(prompts), args.batch_size):
        outputs += run(model, prompts[i : i + args.batch_size], args.max_tokens, bool(adapters))
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {"seconds": seconds, "output_tokens": sum(map(len, outputs)), "outputs": outputs}
        )
    )


def run(model, prompts, max_tokens, with_adapters) -> list[list[int]]:
    """Left-padded greedy generation of one batch; each row under its own adapter."""
    width = max(len(p["prompt_token_ids"]) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, p in enumerate(prompts):
        tokens = p["prompt_token_ids"]
        ids[row, width - len(tokens) :] = torch.tensor(tokens)
        mask[row, width - len(tokens) :] = 1
    kw = {"attention_mask": mask, "max_new_tokens": max_tokens, "min_new_tokens": max_tokens,
          "do_sample": False, "pad_token_id": 0}  # fmt: skip
    names = [p["adapter"] or "__base__" for p in prompts]
    if with_adapters and _stacked(model):
        return _by_adapter(model, ids, names, kw)
    if with_adapters:
        kw["adapter_names"] = names
    with torch.no_grad():
        out = model.generate(ids, **kw)
    return out[:, width:].tolist()


def _stacked(model) -> bool:
    """Whether an adapter targets parameters (a mixture of experts' stacked experts): PEFT
    runs no mixed batch (adapter_names) then."""
    return any(getattr(c, "target_parameters", None) for c in model.peft_config.values())


def _by_adapter(model, ids, names, kw) -> list[list[int]]:
    """The batch's rows one adapter at a time, as PEFT serves stacked-expert LoRA."""
    out: list = [None] * len(names)
    for name in dict.fromkeys(names):
        rows = [i for i, n in enumerate(names) if n == name]
        sub = {**kw, "attention_mask": kw["attention_mask"][rows]}
        with torch.no_grad():
            if name == "__base__":
                with model.disable_adapter():
                    got = model.generate(ids[rows], **sub)
            else:
                model.set_adapter(name)
                got = model.generate(ids[rows], **sub)
        for i, row in zip(rows, got[:, ids.shape[1] :].tolist(), strict=True):
            out[i] = row
    return out


if __name__ == "__main__":
    main()
