"""The engine: requests in, token streams out, one batched forward per step on its own thread.

add_request() may be called from an asyncio server (it returns an async stream) or
submit() from any thread with a callback; the step loop owns every Sequence, so the
only shared state is the Intake of new requests and aborts.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import torch

from serving.engine.adapter_gate import NoAdapters
from serving.engine.admission import check_request
from serving.engine.faults import blame_forward, sample_each
from serving.engine.grammar.masks import grammar_masks, verify_masks
from serving.engine.grammar.pending import PendingGrammars
from serving.engine.intake import Intake
from serving.engine.kv_cache import BlockManager
from serving.engine.lifecycle import Lifecycle
from serving.engine.request import GenerateRequest, RequestOutput
from serving.engine.residency import Residency
from serving.engine.runner import Forward, build_batch
from serving.engine.sampler import sample
from serving.engine.scheduler import Scheduler, SchedulerConfig
from serving.engine.sequence import SeqStatus, Sequence
from serving.engine.speculative.config import SpecConfig
from serving.engine.speculative.decoder import Proposal, SpecDecoder
from serving.engine.step_loop import StepLoop
from serving.engine.streams import stream_outputs
from serving.engine.tracked import Sink, Tracked
from serving.model.step_plan import window_reach

LOAD_WAIT_S = 0.02  # the longest a step waits for the waiting requests' adapter loads
IDLE_WAIT_S = 0.05  # the longest a step waits for a load to land, should no wake come


@dataclass(frozen=True)
class EngineConfig:
    max_model_len: int = 2048
    block_size: int = 16
    num_blocks: int = 512
    enable_prefix_caching: bool = True
    cuda_graphs: bool = True  # decode steps replay CUDA graphs when the model is on a GPU
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    speculative: SpecConfig = field(default_factory=SpecConfig)


class Engine:
    def __init__(
        self,
        model,
        tokenizer,
        config: EngineConfig,
        *,
        slab=None,
        draft_model=None,
        draft_slab=None,
    ):
        """draft_model (with draft_slab for adapters' draft companions): for method draft_model."""
        self.model, self.tokenizer, self.config, self.slab = model, tokenizer, config, slab
        # No further than the model's own context (max_position_embeddings).
        self.max_model_len = min(
            config.max_model_len, getattr(model, "max_context", config.max_model_len)
        )
        self.forward = Forward(
            model, config.num_blocks, config.block_size, slab, cuda_graphs=config.cuda_graphs,
            max_context=self.max_model_len, max_batch=config.scheduler.max_num_seqs,
        )  # fmt: skip
        self.kv = self.forward.kv
        # Blocks below every layer's window (of the draft's too) are released as sequences go.
        spec = config.speculative
        drafts = draft_model is not None and spec.enabled and spec.method == "draft_model"
        window = window_reach(model, *([draft_model] if drafts else []))
        self.blocks = BlockManager(
            config.num_blocks, config.block_size,
            enable_prefix_caching=config.enable_prefix_caching, window=window, draft_kv=drafts,
        )  # fmt: skip
        self.vocab_size = model.config.vocab_size
        self._loop = StepLoop(self.step, lambda exc: self.requests.fail_in_flight(exc))
        # A load landing wakes a step that waits for it (see step).
        self.residency = Residency(slab, self._loop.wake) if slab is not None else None
        gate = self.residency if self.residency else NoAdapters()
        self.scheduler = Scheduler(config.scheduler, self.blocks, gate)
        self.spec = SpecDecoder.create(config.speculative, self.blocks, draft_model, draft_slab)
        self._intake = Intake(self._loop.wake)
        self.grammars = PendingGrammars(tokenizer, self.vocab_size, self._loop.wake)
        self.requests = Lifecycle(tokenizer, self.max_model_len, self.scheduler, self.grammars,
                                  self.residency, self.spec)  # fmt: skip

    # ---- callers (any thread) ----

    def validate(self, request: GenerateRequest) -> None:
        """Raise ValueError for a request that can never run."""
        check_request(request, self.max_model_len, self.vocab_size, self.slab is not None)

    def submit(self, request: GenerateRequest, sink: Sink, *, validated: bool = False) -> None:
        """Queue a request; sink(output) is called from the step thread for each increment.
        validated: the caller ran validate() on it already (the API does, before its queue)."""
        if not validated:
            self.validate(request)
        self._intake.put(request, sink)

    def add_request(
        self, request: GenerateRequest, *, validated: bool = False, pace=None
    ) -> AsyncIterator[RequestOutput]:
        """The request's outputs as they come; leaving the stream early aborts it. pace: see
        stream_outputs."""
        return stream_outputs(self, request, validated=validated, pace=pace)

    def abort(self, request_id: str) -> None:
        self._intake.abort(request_id)

    def start(self) -> None:
        """Run the step loop on a daemon thread until shutdown()."""
        self.grammars.start()  # the compile processes start beside it, on threads of their own
        self._loop.start()

    def shutdown(self) -> None:
        self._loop.stop()
        self.grammars.shutdown()

    @property
    def alive(self) -> bool:
        """False once start() ran and the step thread has ended (shut down or died)."""
        return self._loop.alive

    def run_until_idle(self, max_steps: int = 100_000) -> None:
        """Step in this thread until every request has finished (tests, batch jobs)."""
        for _ in range(max_steps):
            if not self.step() and not self.grammars:
                return
            if not self.scheduler.running:
                # Only adapter loads are pending: yield the core to the loader threads rather
                # than spin (on 2 cores a spin can outlast the steps allowed before a load ends).
                time.sleep(0.001)
        raise RuntimeError(f"still busy after {max_steps} steps")

    # ---- the step loop (one thread) ----

    def step(self) -> bool:
        """One scheduling + forward + sampling step; False when there was nothing to do."""
        requests = self.requests
        arrived = requests.take_intake(self._intake)
        requests.take_compiled()
        if not self.scheduler.has_work():
            return False
        if self.residency is not None and arrived and self.scheduler.waiting:
            # Only new arrivals' loads are left to start (the schedule that saw the others
            # started theirs). They run while this thread waits, not beside the step: a load
            # and a step on two threads contend for the GIL, and each slows the other more
            # than the load costs alone. One that lands in LOAD_WAIT_S joins this step.
            self.scheduler.load_waiting()
            self.residency.wait_loads(LOAD_WAIT_S)
        schedule = self.scheduler.schedule()
        for seq in schedule.preempted:
            requests[seq.request.request_id].unpin(self.residency)
            if self.spec:
                self.spec.forget(seq)
        for seq in schedule.admitted:
            requests.admitted(requests[seq.request.request_id])
        if self.residency is not None:
            self.residency.release_provisional()
        requests.fail_broken_loads()
        if not schedule.scheduled:
            if not schedule.preempted and self.residency and self.residency.any_loading():
                # Everything waits on adapter loads: sleep until one lands (or a request
                # arrives) rather than spin, which would take the cores from the loads.
                self._loop.pause(IDLE_WAIT_S)
            return True
        proposals = self._plan_speculation(schedule) if self.spec else {}
        drafts = {seq_id: p.tokens for seq_id, p in proposals.items()}
        slot_of = self.residency.slot_of if self.residency else None
        batch = build_batch(schedule.scheduled, self.config.block_size, slot_of, drafts)
        plain, unsampled = [], []  # unsampled: max_tokens 0, done once their prompt is in
        for s, row in zip(batch.sampled, batch.first_rows):
            if s.seq.seq_id not in proposals:
                t = requests[s.seq.request.request_id]
                (unsampled if t.stop.max_tokens == 0 else plain).append((t, row))
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                logits = self.forward(batch.inputs)
        except Exception:
            self._forward_failed(schedule.scheduled, drafts)
            return True
        if proposals:
            self.spec.target_step(time.perf_counter() - start)
        # Filled once the forward is launched: on a GPU its kernels (a graph's replay) run
        # meanwhile, and the sampler's first read of the logits waits for them.
        masks = grammar_masks([t.grammar for t, _ in plain])
        for item in schedule.scheduled:
            if item.seq.seq_id not in proposals:  # verified sequences are marked once verified
                self.blocks.mark_computed(item.seq, item.num_new_tokens)
        for part in batch.prompt_rows:  # before any output: the first one carries them
            t = requests[part.seq.request.request_id]
            requests.guarded(t, lambda t=t, p=part: requests.score_prompt(t, p, logits))
        for t, _ in unsampled:
            requests.end_unsampled(t)
        if plain:
            every = len(plain) == logits.shape[0]  # no proposals' or prompts' rows between
            rows = logits if every else logits[[row for _, row in plain]]
            states = [t.sampling for t, _ in plain]
            try:
                result = sample(rows, states, masks=masks)
            except Exception:  # some row's data broke the batched draw: find which
                result = sample_each(rows, states, masks)
            for (t, _), token, logprob, error in zip(
                plain, result.token_ids, result.logprobs, result.errors
            ):
                if not requests.live(t):  # its prompt's scoring failed it
                    continue
                if error is not None:
                    requests.fail(t, error, own=True)
                else:
                    requests.guarded(
                        t, lambda t=t, x=token, lp=logprob: requests.emit_token(t, x, lp)
                    )
        for s, row in zip(batch.sampled, batch.first_rows):
            proposal = proposals.get(s.seq.seq_id)
            if proposal is not None:
                t, k = requests[s.seq.request.request_id], len(proposal.tokens)
                requests.guarded(
                    t, lambda t=t, p=proposal, r=row, k=k: self._verify(t, p, logits[r : r + k + 1])
                )
        return True

    def _forward_failed(self, scheduled, drafts) -> None:
        """The batched forward raised: fail the requests whose rows raise alone (see faults)."""
        if self.spec:  # this step's proposals are dropped; drafts resync from committed tokens
            for item in scheduled:
                self.spec.forget(item.seq)
        slot_of = self.residency.slot_of if self.residency else None
        build = lambda item: build_batch([item], self.config.block_size, slot_of, drafts).inputs  # noqa: E731
        for item, error in blame_forward(scheduled, build, self.model, self.kv, self.slab):
            self.requests.fail(self.requests[item.seq.request.request_id], error)

    # ---- speculative decoding ----

    def _plan_speculation(self, schedule) -> dict[int, Proposal]:
        def lookup(seq: Sequence):
            t = self.requests[seq.request.request_id]
            return t.sampling, t.stop.max_tokens - seq.num_output_tokens, t.grammar

        budget = self.config.scheduler.max_num_batched_tokens - schedule.num_tokens
        with torch.inference_mode():
            return self.spec.plan(schedule.scheduled, len(self.scheduler.running), lookup, budget)

    def _verify(self, t: Tracked, proposal: Proposal, logits: torch.Tensor) -> None:
        """Keep the accepted proposals and the target's token; stop exactly where a stop hits."""
        seq = t.seq
        v = self.spec.verify(seq, t.sampling, proposal, logits, verify_masks(t.grammar, proposal))
        for token, logprob in zip(v.token_ids, v.logprobs):
            self.requests.emit_token(t, token, logprob)
            if seq.status is SeqStatus.FINISHED:
                return  # nothing past a stop: the rest of the run is dropped
        # KV is right for the last committed token and the kept proposals; the rest is
        # overwritten later, and only these committed tokens enter the prefix cache.
        self.blocks.mark_computed(seq, v.num_accepted + 1)
