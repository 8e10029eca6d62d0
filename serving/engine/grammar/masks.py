"""Token masks on logits: a constrained row may only pick what its grammar allows next."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def allocate(rows: int, vocab_size: int) -> torch.Tensor:
    """A bitmask with every token allowed: [rows, ceil(vocab_size / 32)] int32, all bits set."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


@dataclass(frozen=True)
class TokenMasks:
    """logits[r, t] = -inf where bit t of bitmask[r] is 0, for r in rows; other rows untouched.

    bitmask [B, ceil(V / 32)] int32 on the CPU, as the grammar matchers fill it.
    """

    bitmask: torch.Tensor
    rows: tuple[int, ...]

    def apply(self, logits: torch.Tensor) -> None:
        """Mask logits [B, V] (float32) in place."""
        if not self.rows:
            return
        import xgrammar  # (see compiler._make_compiler)

        bitmask = self.bitmask.to(logits.device, non_blocking=True)
        covered = min(logits.shape[-1], bitmask.shape[-1] * 32)
        xgrammar.apply_token_bitmask_inplace(
            logits, bitmask, vocab_size=covered, indices=list(self.rows)
        )
        if covered < logits.shape[-1]:  # ids past the tokenizer's are no text at all
            logits[list(self.rows), covered:] = float("-inf")

    def row(self, i: int) -> TokenMasks | None:
        """Row i's mask alone, as a batch of one (None when row i is not constrained)."""
        if i not in self.rows:
            return None
        return TokenMasks(self.bitmask[i : i + 1], (0,))


def grammar_masks(grammars: list) -> TokenMasks | None:
    """The masks of rows whose grammar (a RowGrammar, or None: free) is given, at its state."""
    rows = tuple(i for i, g in enumerate(grammars) if g is not None)
    if not rows:
        return None
    bitmask = allocate(len(grammars), grammars[rows[0]].vocab_size)
    for i in rows:
        grammars[i].fill(bitmask, i)
    return TokenMasks(bitmask, rows)


def verify_masks(grammar, proposal) -> TokenMasks | None:
    """Row j of a verification: the grammar after d1..dj (RowGrammar.fill_along); None: free."""
    if grammar is None:
        return None
    bitmask = grammar.allocate(len(proposal.tokens) + 1)
    grammar.fill_along(proposal.tokens, bitmask, 0)
    return TokenMasks(bitmask, tuple(range(len(bitmask))))
