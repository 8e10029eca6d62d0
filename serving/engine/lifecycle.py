"""Each request's life in the step loop: started, given tokens, finished, or failed on its own.

All of it runs on the step thread. A request's own fault (its data, its adapter's load,
its grammar) ends that request alone; the others in flight carry on.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from adapters.errors import AdapterError, RegistryCorrupt, RegistryUnavailable
from serving.engine.block_hash import prefix_key
from serving.engine.intake import Intake
from serving.engine.prompt_logprobs import score_tokens
from serving.engine.request import GenerateRequest, RequestOutput
from serving.engine.sampler import RowFault, SamplingState
from serving.engine.sequence import Sequence
from serving.engine.stopping import StopChecker
from serving.engine.tracked import Sink, Tracked

if TYPE_CHECKING:
    from serving.engine.runner import PromptRows

# An adapter the registry cannot hand over now (or whole) is not the request's doing.
REGISTRY_FAULTS = (RegistryCorrupt, RegistryUnavailable)
logger = logging.getLogger(__name__)


class Lifecycle:
    """The requests in flight, by id, and what starting, emitting to and ending one touches."""

    def __init__(self, tokenizer, max_model_len: int, scheduler, grammars, residency, spec):
        self.tokenizer, self.max_model_len = tokenizer, max_model_len
        self.scheduler, self.grammars = scheduler, grammars
        self.residency, self.spec = residency, spec
        self.tracked: dict[str, Tracked] = {}

    def __getitem__(self, request_id: str) -> Tracked:
        return self.tracked[request_id]

    # ---- in ----

    def take_intake(self, intake: Intake) -> int:
        """Start what callers submitted and end what they aborted since the last step; how
        many requests it took."""
        requests, aborts = intake.take()
        for request, sink in requests:
            try:
                self._start(request, sink)
            except Exception as exc:  # this request's own data: it alone fails
                logger.exception("request %s could not start", request.request_id)
                self.tracked.pop(request.request_id, None)
                sink(RequestOutput(request.request_id, (), "", True, "error",
                                   error=f"internal error: {type(exc).__name__}"))  # fmt: skip
        for request_id in aborts:
            t = self.tracked.get(request_id)
            if t is not None:
                self.finish(t, "abort")
        return len(requests)

    def _start(self, request: GenerateRequest, sink: Sink) -> None:
        prompt = list(request.prompt_token_ids)
        seq = Sequence(request=request, token_ids=prompt, adapter_key=prefix_key(request))
        room = self.max_model_len - len(prompt)
        stop = StopChecker(
            params=request.sampling,
            eos_token_ids=tuple(self.tokenizer.eos_token_ids),
            max_tokens=min(request.sampling.max_tokens, room),
            stream=self.tokenizer.decode_stream(),
        )
        t = Tracked(seq, SamplingState.make(request.sampling, prompt), stop, sink)
        self.tracked[request.request_id] = t
        if request.sampling.prompt_logprobs is not None:
            seq.wants_prompt_logits = True
            t.prompt_logprobs = [None] * len(prompt)
        elif stop.max_tokens == 0:  # nothing to compute: no token, no prompt logprobs
            self.finish(t, "length")
            return
        if request.response_format is not None:
            self.grammars.add(t)  # scheduled once its grammar is compiled (take_compiled)
        else:
            self.scheduler.add(seq)

    def take_compiled(self) -> None:
        """Schedule the requests whose grammars compiled; fail those whose grammars did not."""
        if not self.grammars:
            return
        ready, failed = self.grammars.ready()
        for t in ready:
            self.scheduler.add(t.seq)
        for t, error, fault in failed:
            # "limited": the request's own tenant holds the compiler, and a retry may succeed
            self.fail(t, error, own=fault in ("own", "limited"), busy=fault in ("busy", "limited"))

    def admitted(self, t: Tracked) -> None:
        if t.cached_tokens < 0:
            t.cached_tokens = t.seq.num_prefix_hit_tokens
        t.pin(self.residency)

    # ---- out ----

    def score_prompt(self, t: Tracked, rows: PromptRows, logits) -> None:
        """Record the prompt logprobs that rows of this step's logits give (a chunk's)."""
        first = rows.start + 1
        targets = t.seq.token_ids[first : first + rows.count]
        n = t.seq.request.sampling.prompt_logprobs or 0
        scored = score_tokens(logits[rows.row : rows.row + rows.count], targets, n)
        t.prompt_logprobs[first : first + rows.count] = scored

    def end_unsampled(self, t: Tracked) -> None:
        """A max_tokens 0 request whose prompt is in: it ends with no token (and its
        prompt logprobs), unless its own step work failed it already."""
        if self.live(t):
            self.finish(t, "length")

    def live(self, t: Tracked) -> bool:
        """Not finished (nor failed) yet."""
        return self.tracked.get(t.seq.request.request_id) is t

    def emit_token(self, t: Tracked, token: int, logprob) -> None:
        seq = t.seq
        if t.grammar is not None and not t.grammar.accept(token):
            raise RuntimeError("the response format's grammar refused a sampled token")
        seq.token_ids.append(token)
        t.sampling.output_ids.append(token)
        text, reason = t.stop.add(token, seq.num_output_tokens)
        if reason is None and t.grammar is not None and t.grammar.terminated:
            text, reason = text + t.stop.end(), "stop"  # a stop token under ignore_eos
        elif reason == "length" and t.grammar is not None and t.grammar.ended:
            reason = "stop"  # max_tokens ran out on the value's last token: the value is whole
        out = t.output((token,), text, reason, (logprob,) if logprob else ())
        if reason is not None:
            self.finish(t, reason, emitted=True)
        t.sink(out)

    def finish(
        self, t: Tracked, reason: str, *, emitted=False, error=None, own=False, busy=False
    ) -> None:
        self.grammars.drop(t.seq.request.request_id)
        self.scheduler.remove(t.seq)
        if self.spec:
            self.spec.forget(t.seq)
        t.unpin(self.residency)
        self.tracked.pop(t.seq.request.request_id, None)
        if not emitted:
            out = t.output((), "", reason)
            t.sink(dataclasses.replace(out, error=error, own_fault=own, busy=busy))

    # ---- faults: a request's own fault fails that request only ----

    def guarded(self, t: Tracked, work) -> None:
        """Run one request's share of the step; what it raises fails that request alone."""
        try:
            work()
        except RowFault as exc:
            self.fail(t, str(exc), own=True)
        except Exception as exc:
            logger.exception("request %s failed in its own step work", t.seq.request.request_id)
            self.fail(t, f"internal error: {type(exc).__name__}")

    def fail(self, t: Tracked, error: str, *, own: bool = False, busy: bool = False) -> None:
        """own: the request's own data is the cause (RequestOutput.own_fault), not the engine;
        busy: the engine could not serve it now, and may if it is sent again."""
        if self.live(t):
            self.finish(t, "error", error=error, own=own, busy=busy)

    def fail_in_flight(self, exc: Exception) -> None:
        """A whole step failed and no one request was to blame: every request in flight fails."""
        for t in list(self.tracked.values()):
            self.finish(t, "error", error=f"internal error: {type(exc).__name__}")

    def fail_broken_loads(self) -> None:
        """Fail the requests waiting on an adapter whose load failed (not those running): as
        their own fault when the adapter itself cannot be served (it does not fit the model,
        say, published without the base model's checks), else as the engine's. Then the
        residency forgets the versions short of room that no request in flight names."""
        if self.residency is None:
            return
        for version, error in self.residency.broken_loads():
            own = isinstance(error, AdapterError) and not isinstance(error, REGISTRY_FAULTS)
            for t in list(self.tracked.values()):
                if t.seq.request.adapter == version and not t.pinned:
                    self.finish(t, "error", error=f"adapter {version}: {error}", own=own)
        if self.residency.num_short():  # the scan only while some adapter waits for room
            self.residency.keep_short({t.seq.request.adapter for t in self.tracked.values()})
