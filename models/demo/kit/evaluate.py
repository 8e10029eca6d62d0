"""What the card reports: validation losses, FP8 perplexity, adapter effects, draft acceptance."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from kernels.fp8 import dequantize_fp8, quantize_fp8


@torch.no_grad()
def val_loss(model, windows: torch.Tensor, batch: int = 8) -> float:
    """Mean next-token cross-entropy (nats) over validation windows [n, seq + 1], in fp32."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], batch):
        ids = windows[i : i + batch]
        logits = model(input_ids=ids[:, :-1]).logits
        total += F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="sum").item()
        count += ids[:, 1:].numel()
    return total / count


@torch.no_grad()
def fp8_round_trip(model):
    """A copy whose decoder linears hold their FP8 e4m3 per-channel values, as the FP8 base serves."""
    out = copy.deepcopy(model)
    for layer in out.model.layers:
        for module in layer.modules():
            if isinstance(module, torch.nn.Linear):
                w_q, scale = quantize_fp8(module.weight.data)
                module.weight.data = dequantize_fp8(w_q, scale, torch.float32)
    return out


def perplexity(loss: float) -> float:
    return math.exp(loss)


@torch.no_grad()
def greedy(model, prompt: list[int], new_tokens: int, repetition_penalty: float = 1.0,
           stop: tuple[int, ...] = ()) -> list[int]:  # fmt: skip
    """Greedy continuation of prompt (fp32, no cache: the contexts are short)."""
    model.eval()
    ids = list(prompt)
    for _ in range(new_tokens):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        if repetition_penalty != 1.0:  # the CTRL rule, as transformers and the engine apply it
            seen = torch.tensor(sorted(set(ids)))
            vals = logits[seen]
            logits[seen] = torch.where(
                vals > 0, vals / repetition_penalty, vals * repetition_penalty
            )
        token = int(logits.argmax())
        if token in stop:
            break
        ids.append(token)
    return ids[len(prompt) :]


@torch.no_grad()
def acceptance(
    target, draft, prompts: list[list[int]], k: int, new_tokens: int
) -> dict[str, float]:
    """Greedy speculative decoding simulated exactly: the draft proposes k, the target's
    greedy continuation decides how many are accepted, plus the target's own token.

    Returns the acceptance rate (accepted / proposed) and tokens per verification step.
    """
    accepted = proposed = steps = tokens = 0
    for prompt in prompts:
        ref = greedy(target, prompt, new_tokens)
        pos = 0
        while pos < len(ref):
            proposal = greedy(draft, prompt + ref[:pos], k)
            run = 0
            while run < min(k, len(ref) - pos) and proposal[run] == ref[pos + run]:
                run += 1
            accepted, proposed, steps = accepted + run, proposed + k, steps + 1
            pos += run + 1
        tokens += len(ref)
    return {"acceptance_rate": accepted / proposed, "tokens_per_step": tokens / steps}
