"""A request inside the engine: its tokens so far, its KV blocks and where it stands."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from serving.engine.request import GenerateRequest

_ids = itertools.count()


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # not scheduled yet, or preempted (its KV freed, to be recomputed)
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """Mutable engine-side state of one request (the step loop's thread owns it)."""

    request: GenerateRequest
    token_ids: list[int]  # prompt then generated tokens
    adapter_key: str | None  # the adapter's content digest, keying the prefix cache; None: base
    seq_id: int = field(default_factory=lambda: next(_ids))
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0  # tokens whose KV is in the cache (prefix hits + computed)
    num_prefix_hit_tokens: int = 0  # of those, how many came from the prefix cache (for usage)
    # Under a sliding window: its leading table entries that are RELEASED (engine/kv_window.py),
    # and the prefix-cache hash of the last of them (the parent of the next block's)
    num_released_blocks: int = 0
    released_hash: int | None = None
    num_draft_tokens: int = 0  # leading tokens with a draft model's KV (speculative/draft.py)
    arrival: int = 0  # the step it arrived in, for FCFS
    queued: int = 0  # the step it last joined the waiting queue (its wait, for starve_steps)
    # Its prompt's logits are wanted (prompt_logprobs not yet delivered): every prompt
    # position gets a logits row, and no prefix-cache hit may skip one
    wants_prompt_logits: bool = False

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed(self) -> int:
        """Tokens whose KV is not computed yet (the whole prompt at first, then 1 per decode)."""
        return len(self.token_ids) - self.num_cached_tokens
