"""Prompt log-probabilities: how likely the model (under the request's adapter) finds each
prompt token given the ones before it, as vLLM's `prompt_logprobs` and OpenAI's legacy
`echo` report them.

    prompt     t0    t1    t2    t3
    rows       r0    r1    r2          (row p: the logits at position p, which predict p + 1)
    scores     None  r0[t1] r1[t2] r2[t3]

The rows come from the step's forward (serving/engine/runner.py asks for them, chunk by
chunk); these are the model's raw log-probabilities, before any logits processor. The
scored values leave the device as Python floats, once per chunk, so no request holds a
tensor.
"""

from __future__ import annotations

import torch

from serving.engine.request import TokenLogprob
from serving.engine.sampler import NON_FINITE, RowFault

# Rows scored at once: the float32 log-softmax is a copy of rows x vocabulary (a chunk of
# 2048 rows over a 128k vocabulary would be 1 GiB more).
ROWS_AT_ONCE = 256


def score_tokens(logits: torch.Tensor, targets: list[int], n: int) -> list[TokenLogprob]:
    """Each target's log-probability, rank and the top-n under its row of logits [R, V].

    Raises RowFault when a row is not finite (the request's adapter produced NaN or inf).
    """
    if logits.shape[0] != len(targets):
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(targets)} tokens")
    return [
        scored
        for at in range(0, len(targets), ROWS_AT_ONCE)
        for scored in _score(logits[at : at + ROWS_AT_ONCE], targets[at : at + ROWS_AT_ONCE], n)
    ]


def _score(logits: torch.Tensor, targets: list[int], n: int) -> list[TokenLogprob]:
    # float32 whatever the model's dtype: a bf16 log_softmax over the vocabulary is coarse
    lp = torch.log_softmax(logits.float(), dim=-1)  # [R, V]
    chosen = lp.gather(1, torch.tensor(targets, device=lp.device)[:, None])  # [R, 1]
    if not bool(torch.isfinite(chosen).all()):
        raise RowFault(NON_FINITE)
    ranks = ((lp > chosen).sum(dim=-1) + 1).tolist()  # 1: nothing likelier
    n = min(n, lp.shape[1])
    top_lp, top_ids = lp.topk(n, dim=-1) if n else (lp[:, :0], lp[:, :0].long())
    top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
    return [
        TokenLogprob(t, v, tuple(zip(ids, vals)), rank)
        for t, v, ids, vals, rank in zip(
            targets, chosen[:, 0].tolist(), top_ids, top_lp, ranks, strict=True
        )
    ]
