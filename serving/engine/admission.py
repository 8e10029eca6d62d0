"""Whether a request can ever run: checked when it is submitted, before the step loop sees it."""

from __future__ import annotations

from serving.engine.request import GenerateRequest


def check_request(
    request: GenerateRequest, max_model_len: int, vocab_size: int, serves_adapters: bool
) -> None:
    """Raise ValueError, naming the problem, for a request that can never run."""
    ids, limit = request.prompt_token_ids, max_model_len
    if len(ids) == 0:
        raise ValueError("the prompt is empty")
    if len(ids) >= limit:
        raise ValueError(f"the prompt has {len(ids)} tokens; the model serves at most {limit}")
    # An id outside the embedding would fail the whole batched forward, not just this request.
    bad = next((i for i in ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt token id {bad} is outside the vocabulary (0..{vocab_size - 1})")
    sampling = request.sampling
    if sampling.max_tokens < 0:  # 0: the prompt alone (its prompt_logprobs), no token
        raise ValueError(f"max_tokens must be at least 0, got {sampling.max_tokens}")
    for name in ("logprobs", "prompt_logprobs"):
        n = getattr(sampling, name)
        if n is not None and n < 0:
            raise ValueError(f"{name} must be at least 0, got {n}")
    if sampling.seed is not None and not 0 <= sampling.seed < 2**63:
        raise ValueError(f"seed must be in 0..2**63-1, got {sampling.seed}")
    bad = next((i for i in sampling.stop_token_ids if not 0 <= i < 2**63), None)
    if bad is not None:
        raise ValueError(f"stop token id {bad} is out of range")
    bad = next((i for i, _ in sampling.logit_bias if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise ValueError(f"logit_bias token id {bad} is outside the vocabulary "
                         f"(0..{vocab_size - 1})")  # fmt: skip
    if not 0.0 <= sampling.min_p <= 1.0:
        raise ValueError(f"min_p must be in 0..1, got {sampling.min_p}")
    if request.adapter and not serves_adapters:
        raise ValueError(f"adapter {request.adapter!r}: this engine serves no adapters")
