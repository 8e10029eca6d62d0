"""How many tokens to propose for one sequence, from its acceptance so far and the draft's cost.

With per-token acceptance a and a draft step costing c of a target step, k proposals give
(1 - a^(k+1)) / (1 - a) tokens per step for k*c + 1 (Leviathan et al. 2023), plus `verify_cost`
per extra verified row. k is the argmax of tokens per cost; 0 when no k beats plain decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

PRIOR = 0.6  # acceptance assumed before a sequence has any history
SMOOTHING = 0.3  # weight of the newest step in the running acceptance
# Speculate only for a clear expected gain: the model of cost leaves out the per-step
# overheads of proposing and verifying, which a marginal gain would not repay.
MIN_GAIN = 1.1


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens per verification step when each of k proposals is accepted with probability alpha."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_k(alpha: float, max_k: int, draft_cost: float, verify_cost: float) -> int:
    """The k in 0..max_k with the most tokens per unit of cost (0 = decode plainly)."""
    best, best_rate = 0, 1.0
    for k in range(1, max_k + 1):
        rate = expected_tokens(alpha, k) / (1.0 + k * (draft_cost + verify_cost))
        if rate > best_rate * MIN_GAIN:
            best, best_rate = k, rate
    return best


@dataclass
class AcceptanceTracker:
    """The running acceptance rate of one sequence."""

    alpha: float = PRIOR
    steps: int = 0

    def update(self, proposed: int, accepted: int) -> None:
        if proposed:
            self.alpha += SMOOTHING * (accepted / proposed - self.alpha)
            self.steps += 1
