"""Prompt lookup: propose the tokens that followed the last earlier occurrence of the
sequence's final n tokens (n from ngram_max down to ngram_min). No model, no KV.

tokens  ... a b c X Y Z ... a b c      suffix "a b c" matched earlier -> propose X Y Z (k = 3)
"""

from __future__ import annotations

import torch


def propose_ngram(token_ids: list[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """Up to k tokens continuing the latest earlier match of the longest matching suffix."""
    n_tokens = len(token_ids)
    if k < 1 or n_tokens < ngram_min + 1:
        return []
    tokens = torch.tensor(token_ids, dtype=torch.int64)  # [L]
    for n in range(min(ngram_max, n_tokens - 1), ngram_min - 1, -1):
        suffix = tokens[-n:]
        # windows[i] = tokens[i : i + n], leaving out the suffix's own window
        windows = tokens[:-1].unfold(0, n, 1)  # [L - n, n]
        hits = (windows == suffix).all(dim=1).nonzero()
        if hits.numel():
            start = int(hits[-1]) + n  # the latest match: the most local context
            return token_ids[start : start + k]
    return []
