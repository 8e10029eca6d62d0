"""Which sequences run in the next step, and how many of their tokens.

Iteration-level continuous batching with chunked prefill (vLLM's unified view): a
running sequence needs its uncomputed tokens (a prompt chunk, or 1 to decode), a
waiting one gets admitted when the budgets allow:
  tokens   max_num_batched_tokens per step (a long prompt is cut into chunks)
  seqs     max_num_seqs running at once
  KV       free blocks; when a running sequence cannot grow, the lowest-priority,
           newest running sequence is preempted: its blocks are freed and it waits
           to be recomputed (its tokens are kept, so its output does not change).
           Under a sliding window a sequence releases the blocks behind it as it goes
           (engine/kv_window.py), so a prompt chunk is cut to what the free blocks hold
  adapters resident in the slab (its pages decide how many), and at most max_loras
           distinct ones among the running sequences when that legacy cap is set
Order: interactive before batch, first come first served within a class; a waiting
request ages one class per `aging_steps` steps, so batch work is never starved. The step
that admits a request of a higher class than some running ones leaves those out (they keep
their KV and go on next step): an interactive request's first token then waits for its own
prefill only, not for a step that also decodes every running batch item.

Adapters: a request whose adapter is resident goes ahead of a younger one whose adapter is
not; that one waits for its load (started in the background) without holding back the
requests behind it. Each step then loads ahead: the adapters of the next waiting requests,
in their order, are prefetched while the step runs, as far as the slab has room without
evicting one a running or waiting request holds (engine/residency.py).

Bounded wait. A request whose adapter finds no room (every page pinned or loading, or
max_loras reached) could wait forever behind younger requests that keep theirs pinned. So
once a request has waited `starve_steps` steps and is turned away for want of room, no
request behind it that needs an adapter is admitted, and nothing is loaded ahead, until it
is admitted (base-model requests, which take no pages, still are). The running sequences
finish and unpin, its load finds room, and it is admitted. The request first in order is
thus admitted within
    starve_steps + D + L + D'  steps of joining the queue,
D: the most steps a sequence running when it starves still needs (its prompt chunks and
tokens to go), L: the steps its adapter's load takes once it has room, D': the steps the
base-model requests admitted meanwhile need, should they hold the seats or KV it needs.
A batch item first ages into the interactive class (aging_steps); a request further back
waits, in addition, for those ahead of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from serving.engine.adapter_gate import AdapterGate, Wait
from serving.engine.kv_cache import BlockManager
from serving.engine.sequence import SeqStatus, Sequence


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_loras: int | None = None  # distinct adapters running at once; None: the slab decides
    aging_steps: int = 64
    starve_steps: int = 32  # a request turned away this long for want of room holds back others


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
        adapters: AdapterGate,
    ):
        self.config = config
        self.blocks = blocks
        self.adapters = adapters
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.step_count = 0
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.arrival = seq.queued = self.step_count
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
            n = self.blocks.chunk_that_fits(seq, n)  # under a window, what fits now
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
        admitted: list[Sequence] = []
        adapters = self._running_adapters()
        held: list[Sequence] = []
        joinable = self._joinable(adapters, held)
        while budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = next(joinable, None)
            if seq is None:
                break
            hits, n = self._first_chunk(seq, budget)  # a look-up; nothing changes yet
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
        self._load_ahead(adapters)
        return admitted

    def load_waiting(self) -> None:
        """Start the loads of the waiting requests' adapters now, as a step's admission
        would (_load_ahead): called before schedule(), so loads that take a moment can land
        in time for this step's admissions."""
        if self.waiting:
            self._load_ahead(self._running_adapters())

    def _load_ahead(self, running: set[str]) -> None:
        """Prefetch the adapters of the requests still waiting, in their order, so the next
        steps find them resident (as many as a step could admit; the slab stops at its room).
        Nothing behind a starving request short of room: what room frees up is its own."""
        versions: list[str] = []
        for seq in sorted(self.waiting, key=self._rank):
            version = seq.request.adapter
            if not version or version in running:
                continue
            if version not in versions:
                versions.append(version)
            starved = self._starving(seq) and self.adapters.short_of_room(version)
            if starved or len(versions) == self.config.max_num_seqs:
                break
        if versions:
            self.adapters.load_ahead(versions)

    def _urgent_class(self, budget: int) -> int | None:
        """The class of the first waiting request that could be admitted this step, when it
        ranks above some running sequence (which then yields the step to it); else None.

        Only an admission that can happen now counts (a free sequence slot, its adapter
        resident and not held back, its KV free), so lower classes never pause for a
        request that waits on: one that paused for a request _admit then turns away would
        pause again every step, and neither would ever run.
        """
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return None
        lowest = max((self._rank(s)[0] for s in self.running), default=None)
        if lowest is None:
            return None
        for seq in self._joinable(self._running_adapters(), []):
            level = self._rank(seq)[0]
            if level >= lowest:
                return None  # nothing running ranks below the best candidate
            hits, n = self._first_chunk(seq, budget)
            if self.blocks.can_allocate(seq, hits + n):
                return level
            return None  # FCFS within the queue: no later request is admitted first
        return None

    def _first_chunk(self, seq: Sequence, budget: int) -> tuple[int, int]:
        """(prefix-hit tokens, tokens to compute) of a waiting sequence's first step: up to
        the budget, and under a sliding window what the free blocks hold."""
        hits = self.blocks.num_prefix_hit_tokens(seq)
        return hits, self.blocks.chunk_that_fits(seq, min(seq.num_tokens - hits, budget))

    def _joinable(self, adapters: set[str], held: list[Sequence]) -> Iterator[Sequence]:
        """The waiting sequences whose adapters let them join the running ones (`adapters`,
        which the caller grows as it admits) now, in admission order.

        The first one that has waited starve_steps and finds no room for its adapter goes
        into `held`; from then on only base-model requests are yielded (module docstring).
        """
        for seq in sorted(self.waiting, key=self._rank):
            version = seq.request.adapter
            if held and version is not None:
                continue
            wait = self._adapter_wait(version, adapters)
            if wait is None:
                yield seq
            elif wait is Wait.NO_ROOM and self._starving(seq):
                held.append(seq)

    def _adapter_wait(self, version: str | None, adapters: set[str]) -> Wait | None:
        """Why a request of version cannot join the running ones (their adapters) now, or
        None if it can: the base model or one of theirs always can, another adapter once it
        is resident (and under max_loras, when set)."""
        if version is None or version in adapters:
            return None
        cap = self.config.max_loras
        if cap is not None and len(adapters) >= cap:
            return Wait.NO_ROOM
        if self.adapters.ready(version):
            return None
        return Wait.NO_ROOM if self.adapters.short_of_room(version) else Wait.LOADING

    def _running_adapters(self) -> set[str]:
        return {s.request.adapter for s in self.running if s.request.adapter}

    def _starving(self, seq: Sequence) -> bool:
        return self.step_count - seq.queued >= self.config.starve_steps

    def _preempt(self, seq: Sequence) -> None:
        """Free seq's KV; it waits to be recomputed from its tokens (prompt + output so far)."""
        self.running.remove(seq)
        self.blocks.deallocate(seq)
        seq.status = SeqStatus.WAITING
        seq.queued = self.step_count
        self.waiting.append(seq)
        self.num_preemptions += 1

    def _rank(self, seq: Sequence) -> tuple[int, int]:
        """Sort key: priority class, aged by waiting time, then arrival (FCFS)."""
        age = (self.step_count - seq.arrival) // self.config.aging_steps
        return (int(seq.request.priority) - age, seq.arrival)
