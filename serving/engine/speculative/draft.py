"""The draft-model proposer: a smaller model with the target's tokenizer drafts k tokens.

Its paged KV cache is its own tensors, addressed by the target's block tables: position p of
a sequence lives in the same block and offset in both caches, so allocation, prefix hits and
preemption need no second block manager. The draft's KV may lag the target's (speculation
was off, or a prefix hit brought target KV only); each proposal first catches the draft up
from seq.num_draft_tokens to the sequence's last token, in the same forward as its first
draft token. Under a sliding window (every layer of both models has one) the block manager
keeps the blocks that catch-up reads (engine/kv_window.py).

A request whose adapter was uploaded with a draft companion runs the draft under that
companion (from the draft's own slab); every other request drafts base-only.

A constrained request drafts under its grammar: each round's logits are masked with the
grammar advanced along the drafts so far, and the grammar is rolled back once proposing ends
(verification masks the target's rows the same way, and only emitted tokens advance it).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from adapters.slab.stats import SlabFull
from serving.engine.grammar.masks import grammar_masks
from serving.engine.grammar.matcher import RowGrammar
from serving.engine.kv_window import KVWindow
from serving.engine.logits_processors import apply_penalties, sampling_probs
from serving.engine.sampler import RowFault, SamplingState, draw, keyed
from serving.engine.sequence import Sequence
from serving.model.step_plan import StepPlan, StepSeq, build_step, plan_step, window_reach

# Adapter versions the draft remembers as drafting base-only (no companion, or one that failed
# to load), at most: the one asked about least recently is forgotten first, and costs one more
# load if it comes back.
MAX_BASE_ONLY = 1024
# Seconds a version whose companion failed to load for another reason than its absence (the
# registry unreachable, say) drafts base-only before the load is tried again. An absent
# companion is never tried again: a version never changes.
COMPANION_RETRY_S = 60.0


class BaseOnly:
    """The versions that draft base-only, each until a time of clock (inf: for good); at
    most MAX_BASE_ONLY, least recently asked about out first."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()

    def __contains__(self, version: str) -> bool:
        until = self._until.get(version)
        if until is None:
            return False
        if until <= self.clock():  # its companion's load may be tried again
            del self._until[version]
            return False
        self._until.move_to_end(version)
        return True

    def __len__(self) -> int:
        return len(self._until)

    def add(self, version: str, seconds: float = math.inf) -> None:
        """version drafts base-only for the next `seconds`."""
        self._until[version] = self.clock() + seconds
        self._until.move_to_end(version)
        while len(self._until) > MAX_BASE_ONLY:
            self._until.popitem(last=False)


@dataclass
class DraftRequest:
    """One sequence to draft for this step: k tokens from its committed tokens."""

    seq: Sequence
    state: SamplingState
    k: int
    tokens: list[int] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)  # [V] each, sampled requests only
    grammar: RowGrammar | None = None  # a constrained request drafts under its grammar


class DraftModelProposer:
    def __init__(self, model, num_blocks: int, block_size: int, slab=None,
                 window: KVWindow | None = None):  # fmt: skip
        """window: the block manager's, whose released blocks the draft must not read."""
        self.model, self.block_size, self.slab = model, block_size, slab
        self.window = window or KVWindow(None, block_size)
        self.reach = window_reach(model)  # its own layers' widest window, for plan_step
        self.kv = model.allocate_kv(num_blocks, block_size)
        self.base_only = BaseOnly()  # versions whose companion is absent or failed to load

    def forget(self, seq: Sequence) -> None:
        """seq's blocks are gone (finished or preempted): its draft KV starts again from 0."""
        seq.num_draft_tokens = 0

    def accepted(self, seq: Sequence, num_tokens_before: int, k: int, num_accepted: int) -> None:
        """After verification: drafts d1..d(k-1) got draft KV; those kept stay valid."""
        seq.num_draft_tokens = num_tokens_before + min(num_accepted, k - 1)

    def propose(self, requests: list[DraftRequest]) -> None:
        """Fill each request's tokens (and probs when sampled) with k drafts."""
        slots, pinned = self._companion_slots(requests)
        try:
            active = [r for r in requests if r.k > 0]
            rnd = 0
            while active:
                logits = self.model.forward(self._plan(active, rnd, slots))
                self._choose(active, logits)
                rnd += 1
                active = [r for r in active if len(r.tokens) < r.k]
        finally:
            for version in pinned:
                self.slab.release(version)
            for r in requests:  # the grammar holds committed tokens only
                if r.grammar is not None:
                    r.grammar.rollback(len(r.tokens))
        for r in requests:  # the committed tokens; `accepted` adds the kept drafts
            r.seq.num_draft_tokens = r.seq.num_tokens

    def _plan(self, active: list[DraftRequest], rnd: int, slots: dict[int, int]) -> StepPlan:
        """Round 0: every token from the draft's cached count to the last one; then one draft."""
        seqs = []
        for r in active:
            seq = r.seq
            if rnd == 0:
                first = min(seq.num_draft_tokens, seq.num_tokens - 1)
                # Never below where a query's window misses the blocks the sequence released
                # (they are kept for the draft, unless a failed step made it forget): the
                # draft's KV between is stale then, which costs acceptance, not tokens.
                first = max(first, self.window.first_query_clear_of(seq.num_released_blocks))
                toks, start = seq.token_ids[first:], first
            else:
                toks, start = [r.tokens[-1]], seq.num_tokens + rnd - 1
            seqs.append(StepSeq(toks, start, seq.block_table, slots.get(seq.seq_id, -1)))
        inputs = build_step(seqs, self.block_size, adapters=self.slab is not None)
        return plan_step(inputs, self.kv, self.slab, self.reach)

    def _choose(self, active: list[DraftRequest], logits: torch.Tensor) -> None:
        """Each request's next draft: the penalized argmax, or a draw from its own sampling
        distribution q (kept for the acceptance test)."""
        states = [
            SamplingState(
                r.state.params, r.state.generator, r.state.prompt_ids, r.state.output_ids + r.tokens
            )
            for r in active
        ]
        logits = logits.float()
        masks = grammar_masks([r.grammar for r in active])
        if masks is not None:
            logits = logits.clone()
            masks.apply(logits)
        penalized = apply_penalties(logits, states)
        for r, row, s in zip(active, penalized, states):
            if s.params.greedy:
                self._propose(r, int(row.argmax()))
                continue
            q = sampling_probs(row[None].cpu(), [s.params])[0]  # the request's CPU generator
            try:
                token = draw(q, keyed(s))  # a seeded row: the draw verification repeats
            except RowFault:
                # The draft cannot sample this row (say, its companion overflows): propose a
                # point mass instead. Verification is exact for whatever q a draft came from.
                token = int(row.nan_to_num(nan=float("-inf")).argmax())
                q = torch.zeros_like(q)
                q[token] = 1.0
            if self._propose(r, token):
                r.probs.append(q)

    @staticmethod
    def _propose(r: DraftRequest, token: int) -> bool:
        """Add a draft; a constrained request stops drafting at a token its grammar refuses
        (only a fallback draw can pick one) or once its grammar has ended."""
        if r.grammar is not None and not r.grammar.accept(token):
            r.k = len(r.tokens)
            return False
        r.tokens.append(token)
        if r.grammar is not None and r.grammar.terminated:
            r.k = len(r.tokens)
        return True

    def _companion_slots(self, requests: list[DraftRequest]) -> tuple[dict[int, int], list[str]]:
        """seq_id -> the draft slab slot of its adapter's companion; the versions pinned."""
        slots: dict[int, int] = {}
        pinned: list[str] = []
        if self.slab is None:
            return slots, pinned
        for r in requests:
            version = r.seq.request.adapter
            if not version or version in self.base_only:
                continue
            try:
                slot = self.slab.acquire(version)  # a small load, on first use only
            except SlabFull:  # every slot pinned this step: draft base-only
                continue
            except LookupError:  # no companion: base-only for good
                self.base_only.add(version)
                continue
            except Exception:  # one that does not fit, or the registry failed: for a while
                self.base_only.add(version, COMPANION_RETRY_S)
                continue
            pinned.append(version)
            slots[r.seq.seq_id] = slot
        return slots, pinned
