"""A request as the step loop tracks it: its sequence, sampling state, stop checker and sink."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from serving.engine.grammar.matcher import RowGrammar
from serving.engine.request import RequestOutput, TokenLogprob
from serving.engine.sampler import SamplingState
from serving.engine.sequence import Sequence
from serving.engine.stopping import StopChecker

Sink = Callable[[RequestOutput], None]


@dataclass(eq=False)
class Tracked:
    seq: Sequence
    sampling: SamplingState
    stop: StopChecker
    sink: Sink
    cached_tokens: int = -1  # prefix-hit tokens at first admission (-1: not admitted yet)
    pinned: bool = False
    grammar: RowGrammar | None = None  # a constrained request's, once compiled
    # With sampling.prompt_logprobs: one per prompt token (the first None), filled chunk by
    # chunk, handed over with the first output
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def output(self, tokens, text: str, reason: str | None, logprobs=()) -> RequestOutput:
        """One increment of this request's stream, with its usage so far (and, the first
        time, its prompt logprobs)."""
        seq = self.seq
        prompt = ()
        if self.prompt_logprobs is not None:
            prompt, self.prompt_logprobs = tuple(self.prompt_logprobs), None
            seq.wants_prompt_logits = False  # a recompute after preemption needs none
        return RequestOutput(
            request_id=seq.request.request_id,
            new_token_ids=tuple(tokens),
            new_text=text,
            finished=reason is not None,
            finish_reason=reason,
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=seq.num_output_tokens,
            cached_tokens=max(self.cached_tokens, 0),
            logprobs=tuple(logprobs),
            prompt_logprobs=prompt,
        )

    def pin(self, residency) -> None:
        """Hold the request's adapter in its slab slot while the request runs (once)."""
        version = self.seq.request.adapter
        if version and not self.pinned:
            residency.pin(version)
            self.pinned = True

    def unpin(self, residency) -> None:
        if self.pinned:
            residency.unpin(self.seq.request.adapter)
            self.pinned = False
