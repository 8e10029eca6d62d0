"""The engine: requests in, token streams out, one batched forward per step on its own thread.

add_request() may be called from an asyncio server (it returns an async stream) or
submit() from any thread with a callback; the step loop owns every Sequence, so the
only shared state is the intake and abort queues behind one lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from serving.engine.kv_cache import BlockManager
from serving.engine.request import GenerateRequest, RequestOutput
from serving.engine.runner import build_batch
from serving.engine.sampler import SamplingState, sample
from serving.engine.scheduler import Scheduler, SchedulerConfig
from serving.engine.sequence import Sequence
from serving.engine.stopping import StopChecker

Sink = Callable[[RequestOutput], None]


@dataclass(frozen=True)
class EngineConfig:
    max_model_len: int = 2048
    block_size: int = 16
    num_blocks: int = 512
    enable_prefix_caching: bool = True
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


@dataclass(eq=False)
class _Tracked:
    seq: Sequence
    sampling: SamplingState
    stop: StopChecker
    sink: Sink
    cached_tokens: int = -1  # prefix-hit tokens at first admission (-1: not admitted yet)
    pinned: bool = False


class Engine:
    def __init__(self, model, tokenizer, config: EngineConfig, *, slab=None):
        self.model, self.tokenizer, self.config, self.slab = model, tokenizer, config, slab
        # Attention is full causal, so a model with a sliding window serves up to its window.
        self.max_model_len = min(
            config.max_model_len, getattr(model, "max_context", config.max_model_len)
        )
        self.kv = model.allocate_kv(config.num_blocks, config.block_size)
        self.blocks = BlockManager(
            config.num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching
        )
        self.scheduler = Scheduler(config.scheduler, self.blocks, self._adapter_ready)
        self.num_computed_tokens = 0  # prefill + decode tokens run through the model (for tests)
        self._tracked: dict[str, _Tracked] = {}
        self._loads: dict[str, Future] = {}  # adapter version -> its background load
        # Versions pinned while the scheduler decided (so no background load can evict them
        # before the sequence that needs them is admitted); released if nobody was admitted.
        self._provisional: list[str] = []
        self._intake: list[tuple[GenerateRequest, Sink]] = []
        self._aborts: list[str] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- callers (any thread) ----

    def validate(self, request: GenerateRequest) -> None:
        """Raise ValueError for a request that can never run."""
        n, limit = len(request.prompt_token_ids), self.max_model_len
        if n == 0:
            raise ValueError("the prompt is empty")
        if n >= limit:
            raise ValueError(f"the prompt has {n} tokens; the model serves at most {limit}")
        if request.sampling.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {request.sampling.max_tokens}")
        if request.adapter and self.slab is None:
            raise ValueError(f"adapter {request.adapter!r}: this engine serves no adapters")

    def submit(self, request: GenerateRequest, sink: Sink) -> None:
        """Queue a request; sink(output) is called from the step thread for each increment."""
        self.validate(request)
        with self._lock:
            self._intake.append((request, sink))
        self._wake.set()

    async def add_request(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """The request's outputs as they come; leaving the stream early aborts it."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.submit(request, lambda out: loop.call_soon_threadsafe(queue.put_nowait, out))
        finished = False
        try:
            while not finished:
                out = await queue.get()
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.abort(request.request_id)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)
        self._wake.set()

    def start(self) -> None:
        """Run the step loop on a daemon thread until shutdown()."""
        self._thread = threading.Thread(target=self._loop, name="engine-step", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def run_until_idle(self, max_steps: int = 100_000) -> None:
        """Step in this thread until every request has finished (tests, batch jobs)."""
        for _ in range(max_steps):
            if not self.step():
                return
        raise RuntimeError(f"still busy after {max_steps} steps")

    # ---- the step loop (one thread) ----

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.step():
                self._wake.wait(timeout=0.05)
                self._wake.clear()

    def step(self) -> bool:
        """One scheduling + forward + sampling step; False when there was nothing to do."""
        self._take_intake()
        if not self.scheduler.has_work():
            return False
        schedule = self.scheduler.schedule()
        for seq in schedule.preempted:
            self._unpin(self._tracked[seq.request.request_id])
        for seq in schedule.admitted:
            self._admitted(self._tracked[seq.request.request_id])
        for version in self._provisional:  # pinned for a sequence that was not admitted after all
            self.slab.release(version)
        self._provisional.clear()
        self._fail_broken_loads()
        if not schedule.scheduled:
            return True
        batch = build_batch(schedule.scheduled, self.config.block_size, self._slot_of)
        with torch.inference_mode():
            logits = self.model.forward(batch.inputs, self.kv, self.slab)
        for item in schedule.scheduled:
            self.blocks.mark_computed(item.seq, item.num_new_tokens)
            self.num_computed_tokens += item.num_new_tokens
        if batch.sampled:
            tracked = [self._tracked[s.seq.request.request_id] for s in batch.sampled]
            result = sample(logits, [t.sampling for t in tracked])
            for t, token, logprob in zip(tracked, result.token_ids, result.logprobs):
                self._emit_token(t, token, logprob)
        return True

    def _take_intake(self) -> None:
        with self._lock:
            intake, aborts = self._intake, self._aborts
            self._intake, self._aborts = [], []
        for request, sink in intake:
            self._start(request, sink)
        for request_id in aborts:
            t = self._tracked.get(request_id)
            if t is not None:
                self._finish(t, "abort")

    def _start(self, request: GenerateRequest, sink: Sink) -> None:
        prompt = list(request.prompt_token_ids)
        key = request.adapter.partition("@")[2] or request.adapter if request.adapter else None
        seq = Sequence(request=request, token_ids=prompt, adapter_key=key)
        room = self.max_model_len - len(prompt)
        stop = StopChecker(
            params=request.sampling,
            eos_token_ids=tuple(self.tokenizer.eos_token_ids),
            max_tokens=min(request.sampling.max_tokens, room),
            stream=self.tokenizer.decode_stream(),
        )
        t = _Tracked(seq, SamplingState.make(request.sampling, prompt), stop, sink)
        self._tracked[request.request_id] = t
        self.scheduler.add(seq)

    def _emit_token(self, t: _Tracked, token: int, logprob) -> None:
        seq = t.seq
        seq.token_ids.append(token)
        t.sampling.output_ids.append(token)
        text, reason = t.stop.add(token, seq.num_output_tokens)
        out = self._output(t, (token,), text, reason, (logprob,) if logprob else ())
        if reason is not None:
            self._finish(t, reason, emitted=True)
        t.sink(out)

    def _output(self, t: _Tracked, tokens, text, reason, logprobs=()) -> RequestOutput:
        seq = t.seq
        return RequestOutput(
            request_id=seq.request.request_id,
            new_token_ids=tuple(tokens),
            new_text=text,
            finished=reason is not None,
            finish_reason=reason,
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=seq.num_output_tokens,
            cached_tokens=max(t.cached_tokens, 0),
            logprobs=tuple(logprobs),
        )

    def _finish(self, t: _Tracked, reason: str, *, emitted: bool = False, error: str | None = None):
        self.scheduler.remove(t.seq)
        self._unpin(t)
        self._tracked.pop(t.seq.request.request_id, None)
        if not emitted:
            t.sink(dataclasses.replace(self._output(t, (), "", reason), error=error))

    # ---- adapters ----

    def _adapter_ready(self, version: str) -> bool:
        """Resident now (then pinned at once)? If not, make sure its load runs in the background."""
        if self.slab.try_acquire(version) is not None:
            self._provisional.append(version)
            return True
        load = self._loads.get(version)
        if load is None or (load.done() and _is_slab_full(load)):
            self._loads[version] = self.slab.prefetch(version)
        return False

    def _fail_broken_loads(self) -> None:
        for version, load in list(self._loads.items()):
            if not load.done():
                continue
            del self._loads[version]
            error = load.exception()
            if error is None or _is_slab_full(load):
                continue
            for t in list(self._tracked.values()):
                if t.seq.request.adapter == version and not t.pinned:
                    self._finish(t, "error", error=f"adapter {version}: {error}")

    def _admitted(self, t: _Tracked) -> None:
        if t.cached_tokens < 0:
            t.cached_tokens = t.seq.num_prefix_hit_tokens
        version = t.seq.request.adapter
        if version and not t.pinned:
            if version in self._provisional:
                self._provisional.remove(version)  # the scheduler's pin becomes this sequence's
            else:
                self.slab.acquire(version)  # pinned already by a running sequence: no load
            t.pinned = True

    def _unpin(self, t: _Tracked) -> None:
        if t.pinned:
            self.slab.release(t.seq.request.adapter)
            t.pinned = False

    def _slot_of(self, version: str) -> int:
        slot = self.slab.slot_of(version)
        assert slot is not None, f"{version} is pinned, so resident"
        return slot


def _is_slab_full(load: Future) -> bool:
    from adapters.slab import SlabFull

    return isinstance(load.exception(), SlabFull)
