"""How the engine speculates (from the server config's `draft` section)."""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("none", "draft_model", "ngram")


@dataclass(frozen=True)
class SpecConfig:
    """Speculation settings; method "none" turns it off."""

    method: str = "none"
    num_speculative_tokens: int = 4  # k: the most tokens proposed per sequence per step
    ngram_min: int = 1  # prompt lookup matches suffixes of ngram_max .. ngram_min tokens
    ngram_max: int = 4
    # Above this many running sequences a step is compute-bound and verifying k + 1 rows
    # per sequence costs more than it saves: speculation is off (0: never off).
    max_batch_size: int = 8
    adaptive: bool = True  # k per request from its acceptance rate and the measured draft cost

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {METHODS}, got {self.method!r}")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError(
                f"num_speculative_tokens must be in 1..16, got {self.num_speculative_tokens}"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(
                f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}"
            )
        if self.max_batch_size < 0:
            raise ValueError(f"max_batch_size must be >= 0, got {self.max_batch_size}")

    @property
    def enabled(self) -> bool:
        return self.method != "none"
