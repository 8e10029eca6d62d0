"""One constrained row's grammar state, advanced by each token the row emits.

The state only ever holds committed tokens. Speculation advances it along a proposal to
fill the masks of the k + 1 verified positions (or of the draft's own rounds), then rolls it
back at once; the tokens verification keeps are then accepted as they are emitted. So a
rejected proposal leaves nothing to undo, exactly as its KV is simply overwritten later.
"""

from __future__ import annotations

import torch

from serving.engine.grammar.masks import allocate


class RowGrammar:
    """Which tokens may come next for one request; `accept` each token it emits."""

    def __init__(self, compiled) -> None:
        import xgrammar  # (see compiler._make_compiler)

        self._m = xgrammar.GrammarMatcher(compiled)
        self.vocab_size = compiled.tokenizer_info.vocab_size  # a bitmask row's width, in bits

    @property
    def terminated(self) -> bool:
        """The output is complete and a stop token has been accepted: nothing more may come."""
        return self._m.is_terminated()

    @property
    def ended(self) -> bool:
        """The output so far is a whole value that nothing may extend: only a stop token may
        come next. (Not just is_completed: a top-level 1 may still grow into 12 or 1.5.)"""
        if not self._m.is_completed():
            return False
        bitmask = self.allocate(1)
        self._m.fill_next_token_bitmask(bitmask, 0)
        bits = (bitmask[0, :, None] >> torch.arange(32, dtype=torch.int32)) & 1  # [words, 32]
        allowed = bits.flatten()[: self.vocab_size].nonzero().flatten().tolist()
        return set(allowed) <= set(self._m.stop_token_ids)

    def allocate(self, rows: int) -> torch.Tensor:
        """A bitmask of this grammar's width with every token allowed: [rows, ceil(V / 32)]."""
        return allocate(rows, self.vocab_size)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """bitmask[row] = the tokens allowed next (after a stop token: every token, unused)."""
        if self._m.is_terminated():
            bitmask[row] = -1
        else:
            self._m.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        """Advance by token; False (and no change) when the grammar does not allow it."""
        return not self._m.is_terminated() and self._m.accept_token(token)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._m.rollback(num_tokens)

    def fill_along(self, drafts: list[int], bitmask: torch.Tensor, first: int) -> int:
        """Fill rows first..first + k with the masks after d1..dj; the state is unchanged.

        Returns how many leading drafts the grammar allows. Rows after the first refused
        draft get every token allowed: verification stops at that draft, so they are unused.
        """
        self.fill(bitmask, first)
        valid = 0
        for j, token in enumerate(drafts):
            if not self.accept(token):
                break
            valid += 1
            self.fill(bitmask, first + j + 1)
        bitmask[first + valid + 1 : first + len(drafts) + 1] = -1
        self.rollback(valid)
        return valid

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many leading tokens the grammar allows in a row; the state is unchanged."""
        valid = 0
        for token in tokens:
            if not self.accept(token):
                break
            valid += 1
        self.rollback(valid)
        return valid
