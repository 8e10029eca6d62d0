"""What a caller asks the engine for, and what comes back: plain frozen dataclasses."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# Temperatures below this are greedy, as vLLM treats them: dividing logits by a smaller one
# only overflows, and the distribution is a point mass on the argmax to float precision anyway.
GREEDY_BELOW = 1e-5


class Priority(enum.IntEnum):
    """Lower runs first: interactive requests before batch items."""

    INTERACTIVE = 0
    BATCH = 1


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. temperature below GREEDY_BELOW (0 too) is greedy."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # drop tokens less likely than min_p times the likeliest; 0: off
    seed: int | None = None
    repetition_penalty: float = 1.0  # 1: off
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n log-probabilities per generated token, None: off
    # top-n log-probabilities of each prompt token given those before it (the first has
    # none), under the request's adapter, before any logits processor; None: off
    prompt_logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit) pairs

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


@dataclass(frozen=True)
class ResponseFormat:
    """What shape a request's output must have: "json_object" (any JSON object),
    "json_schema" (a JSON value that validates against `schema`), or "structural_tag" (text
    in xgrammar's structural-tag form, e.g. tool calls: serving/model/tool_formats.py)."""

    kind: str  # "json_object" | "json_schema" | "structural_tag"
    # json_schema: the schema as JSON text (keys in the order sent); structural_tag: the tag
    # as JSON text, each {"type": "json_schema", "json_schema": ..., "strict"?: ...} node a
    # schema compiled as a json_schema format's is
    schema: str | None = None
    # json_schema: properties and items the schema does not name are refused, as OpenAI's
    # strict mode refuses them (unevaluatedProperties/unevaluatedItems: false)
    strict: bool = False


@dataclass(frozen=True)
class GenerateRequest:
    """One generation: prompt token ids, sampling, the adapter version (name@digest) or None."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    adapter: str | None = None  # "name@digest": the version, so a re-upload is another adapter
    priority: Priority = Priority.INTERACTIVE
    # Salts the prefix cache's root hash: hits are shared only between requests with the same
    # salt (the tenant, when keys are configured), so cached_tokens is no cross-tenant oracle.
    cache_salt: str | None = None
    # Constrained decoding: every token is one the format's grammar allows; None: free text.
    response_format: ResponseFormat | None = None

    @property
    def tenant(self) -> str | None:
        """Whose request it is, where the server tells tenants apart (then its cache salt is
        the tenant); None on a server of one user. Bounds a tenant's share of the engine."""
        return self.cache_salt


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the top-n (token id, logprob), best first
    rank: int | None = None  # the token's rank in its distribution (1: likeliest); prompt's only


@dataclass(frozen=True)
class RequestOutput:
    """One increment of a request's stream; `finished` on the last one."""

    request_id: str
    new_token_ids: tuple[int, ...]
    new_text: str
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()
    # With sampling.prompt_logprobs, on the request's first output only: one per prompt
    # token, None for the first (nothing precedes it)
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()
    error: str | None = None
    # With an error: True when the request's own data (its adapter's output, its sampling
    # parameters) is the cause, so the API answers it as the caller's problem, not a 5xx.
    own_fault: bool = False
    # With an error: the engine could not serve it now (its schema compiler was busy with
    # others' slow schemas), so the same request may succeed if sent again. With own_fault
    # too: the request's own tenant's earlier requests hold what it needs (a rate limit).
    busy: bool = False
