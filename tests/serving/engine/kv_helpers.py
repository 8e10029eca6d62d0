"""Sequences for the block-manager tests, and the runner's side of a step (compute, grow)."""

from serving.engine.request import GenerateRequest
from serving.engine.sequence import Sequence


def make_seq(tokens, adapter_key=None):
    """A fresh sequence whose prompt is `tokens`."""
    request = GenerateRequest(request_id="r", prompt_token_ids=tuple(tokens))
    return Sequence(request=request, token_ids=list(tokens), adapter_key=adapter_key)


def prefill(bm, seq):
    """Allocate the prompt and compute what the cache did not provide, as the engine would."""
    bm.allocate(seq, seq.num_tokens)
    bm.mark_computed(seq, seq.num_tokens - seq.num_cached_tokens)


def decode(bm, seq, tokens):
    """Generate `tokens` one step at a time."""
    for token in tokens:
        seq.token_ids.append(token)
        bm.append(seq, 1)
        bm.mark_computed(seq, 1)
