"""Which sequences run in the next step, and how many of their tokens.

Iteration-level continuous batching with chunked prefill (vLLM's unified view): a
running sequence needs its uncomputed tokens (a prompt chunk, or 1 to decode), a
waiting one gets admitted when the budgets allow:
  tokens   max_num_batched_tokens per step (a long prompt is cut into chunks)
  seqs     max_num_seqs running at once
  KV       free blocks; when a running sequence cannot grow, the lowest-priority,
           newest running sequence is preempted: its blocks are freed and it waits
           to be recomputed (its tokens are kept, so its output does not change)
  adapters at most max_loras distinct adapters among the running sequences
Order: interactive before batch, first come first served within a class; a waiting
request ages one class per `aging_steps` steps, so batch work is never starved. The step
that admits a request of a higher class than some running ones leaves those out (they keep
their KV and go on next step): an interactive request's first token then waits for its own
prefill only, not for a step that also decodes every running batch item. A
request whose adapter is not resident yet is skipped (its load runs in the
background) without holding back the requests behind it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from serving.engine.kv_cache import BlockManager
from serving.engine.sequence import SeqStatus, Sequence


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_loras: int = 16
    aging_steps: int = 64


@dataclass(frozen=True)
class Scheduled:
    seq: Sequence
    num_new_tokens: int  # computed this step, from seq.num_cached_tokens on


@dataclass(frozen=True)
class Schedule:
    scheduled: list[Scheduled]
    preempted: list[Sequence]
    admitted: list[Sequence]  # newly running this step (their adapters must be pinned)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        blocks: BlockManager,
        adapter_ready: Callable[[str], bool],
    ):
        self.config = config
        self.blocks = blocks
        self.adapter_ready = adapter_ready  # is this version resident in the slab now?
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.step_count = 0
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.arrival = self.step_count
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Drop seq wherever it is (finish or abort) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.deallocate(seq)
        seq.status = SeqStatus.FINISHED

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Schedule:
        self.step_count += 1
        budget = self.config.max_num_batched_tokens
        scheduled: list[Scheduled] = []
        preempted: list[Sequence] = []
        urgent = self._urgent_class(budget)
        for seq in sorted(self.running, key=self._rank):
            if seq not in self.running:  # preempted below to make room for an earlier one
                continue
            if urgent is not None and self._rank(seq)[0] > urgent:
                continue  # yields this step to the admission of a higher class
            n = min(seq.num_uncomputed, budget)
            if n == 0:
                continue
            while not self.blocks.can_append(seq, n):
                # never one already scheduled this step: ties in rank would otherwise pick it
                done = {id(s.seq) for s in scheduled}
                victim = max((s for s in self.running if id(s) not in done), key=self._rank)
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                continue
            self.blocks.append(seq, n)
            scheduled.append(Scheduled(seq, n))
            budget -= n
        admitted = self._admit(budget, scheduled) if not preempted else []
        return Schedule(scheduled=scheduled, preempted=preempted, admitted=admitted)

    def _admit(self, budget: int, scheduled: list[Scheduled]) -> list[Sequence]:
        admitted = []
        adapters = {s.request.adapter for s in self.running if s.request.adapter}
        for seq in sorted(self.waiting, key=self._rank):
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            if not self._adapter_fits(seq.request.adapter, adapters):
                continue  # it loads in the background; the requests behind it go on
            hits = self.blocks.num_prefix_hit_tokens(seq)  # a look-up; nothing changes yet
            n = min(seq.num_tokens - hits, budget)
            if not self.blocks.can_allocate(seq, hits + n):
                break  # FCFS: no smaller request jumps the queue for KV
            self.blocks.allocate(seq, hits + n)  # sets num_cached_tokens to the hits
            self.waiting.remove(seq)
            self.running.append(seq)
            seq.status = SeqStatus.RUNNING
            if seq.request.adapter:
                adapters.add(seq.request.adapter)
            scheduled.append(Scheduled(seq, n))
            admitted.append(seq)
            budget -= n
        return admitted

    def _urgent_class(self, budget: int) -> int | None:
        """The class of the first waiting request that could be admitted this step, when it
        ranks above some running sequence (which then yields the step to it); else None.

        Only an admission that can happen now counts (a free sequence slot, its adapter
        resident and within max_loras, its KV free), so lower classes never pause for a
        request that waits on: one that paused for a request _admit then turns away would
        pause again every step, and neither would ever run.
        """
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return None
        lowest = max((self._rank(s)[0] for s in self.running), default=None)
        adapters = {s.request.adapter for s in self.running if s.request.adapter}
        for seq in sorted(self.waiting, key=self._rank):
            level = self._rank(seq)[0]
            if lowest is None or level >= lowest:
                return None  # nothing running ranks below the best candidate
            if not self._adapter_fits(seq.request.adapter, adapters):
                continue
            hits = self.blocks.num_prefix_hit_tokens(seq)
            if self.blocks.can_allocate(seq, hits + min(seq.num_tokens - hits, budget)):
                return level
            return None  # FCFS within the queue: no later request is admitted first
        return None

    def _adapter_fits(self, version: str | None, adapters: set[str]) -> bool:
        """Whether a request of version may join the running ones (their adapters): the
        base model or one of theirs always may; a new adapter if a slot is left for it and
        it is resident already."""
        if version is None or version in adapters:
            return True
        return len(adapters) < self.config.max_loras and self.adapter_ready(version)

    def _preempt(self, seq: Sequence) -> None:
        """Free seq's KV; it waits to be recomputed from its tokens (prompt + output so far)."""
        self.running.remove(seq)
        self.blocks.deallocate(seq)
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)
        self.num_preemptions += 1

    def _rank(self, seq: Sequence) -> tuple[int, int]:
        """Sort key: priority class, aged by waiting time, then arrival (FCFS)."""
        age = (self.step_count - seq.arrival) // self.config.aging_steps
        return (int(seq.request.priority) - age, seq.arrival)
