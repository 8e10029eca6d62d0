"""Per step: which decoding sequences speculate and with what k, their proposals, and what
verification did to each (trackers, draft KV, figures).

A sequence speculates in a step when it is decoding (one uncomputed token), the running batch
is at most `max_batch_size` (above it a step is compute-bound and speculation is off), its k
is at least 1, and the KV pool has room for its k extra positions without preempting anyone.
k is capped so the k + 1 tokens a verification can emit never pass the request's max_tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from serving.engine.kv_cache import BlockManager
from serving.engine.sampler import SamplingState
from serving.engine.scheduler import Scheduled
from serving.engine.sequence import Sequence
from serving.engine.speculative.adaptive import AcceptanceTracker, best_k
from serving.engine.speculative.config import SpecConfig
from serving.engine.speculative.draft import DraftModelProposer, DraftRequest
from serving.engine.speculative.ngram import propose_ngram
from serving.engine.speculative.stats import SpecStats
from serving.engine.speculative.verify import Verified, verify

VERIFY_COST = 0.05  # one more verified row, relative to a decode step (memory-bound decode)
PROBE_EVERY = 32  # a sequence at k = 0 proposes one token this often, to notice a change


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]  # d1..dk
    probs: torch.Tensor | None  # [k, V] the draft's distributions; None: point masses
    num_tokens_before: int  # the sequence's length when it was proposed


class SpecDecoder:
    def __init__(self, config: SpecConfig, blocks: BlockManager, draft: DraftModelProposer | None):
        if config.method == "draft_model" and draft is None:
            raise ValueError("speculative method draft_model needs a draft model")
        self.config, self.blocks, self.draft = config, blocks, draft
        self.stats = SpecStats()
        self._trackers: dict[int, AcceptanceTracker] = {}
        self._idle: dict[int, int] = {}  # seq_id -> steps since it last proposed
        self._draft_cost = 0.0 if config.method == "ngram" else 0.5  # refined by measurement
        self._target_step_seconds: float | None = None

    @staticmethod
    def create(config: SpecConfig, blocks: BlockManager, draft_model=None, draft_slab=None):
        """The engine's decoder, or None when speculation is off."""
        if not config.enabled:
            return None
        draft = None
        if config.method == "draft_model" and draft_model is not None:
            draft = DraftModelProposer(
                draft_model, blocks.num_blocks, blocks.block_size, draft_slab, blocks.window
            )
        return SpecDecoder(config, blocks, draft)

    def forget(self, seq: Sequence) -> None:
        """seq finished or lost its KV."""
        self._trackers.pop(seq.seq_id, None)
        self._idle.pop(seq.seq_id, None)
        if self.draft is not None:
            self.draft.forget(seq)

    def plan(
        self,
        scheduled: list[Scheduled],
        num_running: int,
        lookup: Callable[[Sequence], tuple[SamplingState, int]],
        budget: int,
    ) -> dict[int, Proposal]:
        """Proposals by seq_id for this step; blocks for their extra positions are appended.

        lookup(seq): its sampling state, the output tokens it may still emit, and its
        grammar (None: unconstrained); proposals stop at the first token the grammar refuses;
        budget: the step's spare tokens.
        """
        cfg = self.config
        if cfg.max_batch_size and num_running > cfg.max_batch_size:
            return {}
        wanted: list[tuple[Sequence, int]] = []
        found: dict[int, Proposal] = {}  # n-gram: a lookup, no model, done here
        start = time.perf_counter()
        for item in scheduled:
            seq = item.seq
            if item.num_new_tokens != 1 or seq.num_uncomputed != 1 or seq.num_output_tokens < 1:
                continue
            _, remaining, grammar = lookup(seq)
            k = min(self._k_for(seq), remaining - 1, budget)
            tokens = None
            if cfg.method == "ngram" and k > 0:  # only a match needs room in the KV cache
                tokens = propose_ngram(seq.token_ids, k, cfg.ngram_min, cfg.ngram_max)
                if grammar is not None:  # a refused token would be rejected anyway
                    tokens = tokens[: grammar.valid_prefix(tokens)]
                k = len(tokens)
            while k > 0 and not self.blocks.can_append(seq, 1 + k):
                k -= 1
            if k <= 0:
                continue
            self.blocks.append(seq, 1 + k)
            budget -= k
            wanted.append((seq, k))
            self._idle[seq.seq_id] = 0
            if tokens is not None:
                found[seq.seq_id] = Proposal(tokens[:k], None, seq.num_tokens)
        if not wanted:
            return {}
        proposals = found if cfg.method == "ngram" else self._draft(wanted, lookup)
        self._measure_draft(time.perf_counter() - start, max(k for _, k in wanted))
        return proposals

    def verify(
        self, seq: Sequence, state: SamplingState, proposal: Proposal, logits, masks=None
    ) -> Verified:
        """Verify seq's proposal against its k + 1 rows of logits (masks: its grammar's
        along the proposal), and record the outcome."""
        v = verify(logits, state, proposal.tokens, proposal.probs, masks=masks)
        self.after_verify(seq, proposal, v.num_accepted, len(v.token_ids))
        return v

    def after_verify(
        self, seq: Sequence, proposal: Proposal, num_accepted: int, emitted: int
    ) -> None:
        """Record what verification kept; the draft's KV keeps the kept drafts."""
        k = len(proposal.tokens)
        self._trackers.setdefault(seq.seq_id, AcceptanceTracker()).update(k, num_accepted)
        self.stats.record(seq.request.adapter, k, num_accepted, emitted, seq.request.tenant)
        if self.draft is not None:
            self.draft.accepted(seq, proposal.num_tokens_before, k, num_accepted)

    def target_step(self, seconds: float) -> None:
        """The wall time of one verifying forward (for the draft's cost ratio)."""
        prev = self._target_step_seconds
        self._target_step_seconds = seconds if prev is None else 0.8 * prev + 0.2 * seconds

    # ---- internals ----

    def _k_for(self, seq: Sequence) -> int:
        cfg = self.config
        if not cfg.adaptive:
            return cfg.num_speculative_tokens
        tracker = self._trackers.get(seq.seq_id) or AcceptanceTracker()
        k = best_k(tracker.alpha, cfg.num_speculative_tokens, self._draft_cost, VERIFY_COST)
        if k == 0:
            idle = self._idle.get(seq.seq_id, 0) + 1
            self._idle[seq.seq_id] = idle
            k = 1 if idle % PROBE_EVERY == 0 else 0
        return k

    def _draft(self, wanted: list[tuple[Sequence, int]], lookup) -> dict[int, Proposal]:
        """The draft model's k proposals for each wanted sequence."""
        requests = []
        for seq, k in wanted:
            state, _, grammar = lookup(seq)
            requests.append(DraftRequest(seq, state, k, grammar=grammar))
        self.draft.propose(requests)
        out: dict[int, Proposal] = {}
        for r in requests:
            probs = torch.stack(r.probs) if r.probs else None
            out[r.seq.seq_id] = Proposal(r.tokens, probs, r.seq.num_tokens)
        return out

    def _measure_draft(self, seconds: float, rounds: int) -> None:
        self.stats.draft_seconds += seconds
        if self._target_step_seconds:
            cost = seconds / rounds / self._target_step_seconds
            self._draft_cost = 0.8 * self._draft_cost + 0.2 * cost
