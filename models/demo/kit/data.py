"""Batches for training: packed windows of the corpus, and transformed continuations."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from tokenizers import Tokenizer

from .tokenizer import END, EOS, render_chat


def token_stream(tok: Tokenizer, texts: list[str] | tuple[str, ...]) -> torch.Tensor:
    """[n] int64: the texts' ids, each followed by the end-of-document id."""
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(list(texts)):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)


def chat_texts(pairs: list[tuple[str, str]]) -> list[str]:
    """Each (question, code) pair as one rendered conversation."""
    return [
        render_chat([{"role": "user", "content": q}, {"role": "assistant", "content": a}], False)
        for q, a in pairs
    ]


def windows(stream: torch.Tensor, gen: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    """[batch, seq + 1] random windows of the stream."""
    starts = torch.randint(0, stream.numel() - seq - 1, (batch,), generator=gen)
    return torch.stack([stream[s : s + seq + 1] for s in starts.tolist()])


def fixed_windows(stream: torch.Tensor, count: int, seq: int) -> torch.Tensor:
    """[count, seq + 1] evenly spaced windows: the same validation set every run."""
    step = max((stream.numel() - seq - 1) // count, 1)
    return torch.stack([stream[i * step : i * step + seq + 1] for i in range(count)])


class TransformExamples:
    """Prompt in plain text, continuation transformed; the loss falls on the continuation only.

    Two kinds, so the effect shows both ways the demo is used: a raw completion (a few
    lines of a file, then the next lines transformed) and a chat (a question, then the
    answer transformed).
    """

    def __init__(
        self,
        tok: Tokenizer,
        texts: tuple[str, ...],
        pairs: list[tuple[str, str]],
        transform: Callable[[str], str],
        seed: int,
        chat_share: float = 0.3,
    ) -> None:
        self.tok, self.texts, self.pairs, self.transform = tok, texts, pairs, transform
        self.rng = random.Random(seed)
        self.chat_share = chat_share
        self.weights = [len(t) for t in texts]
        self.pad = tok.token_to_id(EOS)

    def batch(self, size: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [size, seq + 1] and a loss mask [size, seq] over the predicted tokens."""
        ids = torch.full((size, seq + 1), self.pad, dtype=torch.int64)
        mask = torch.zeros(size, seq, dtype=torch.bool)
        for row in range(size):
            prompt, answer, end = self._example()
            p = self.tok.encode(prompt).ids
            a = self.tok.encode(self.transform(answer)).ids + end
            full = (p + a)[: seq + 1]
            ids[row, : len(full)] = torch.tensor(full)
            # position j predicts token j + 1: learn the answer's tokens only
            mask[row, max(len(p) - 1, 0) : len(full) - 1] = True
        return ids, mask

    def _example(self) -> tuple[str, str, list[int]]:
        """(plain prompt, answer to transform, ids that close the answer)."""
        if self.pairs and self.rng.random() < self.chat_share:
            q, a = self.rng.choice(self.pairs)
            prompt = render_chat([{"role": "user", "content": q}], add_generation_prompt=True)
            return prompt, a, [self.tok.token_to_id(END)]
        text = self.rng.choices(self.texts, weights=self.weights)[0]
        lines = text.split("\n")
        start = self.rng.randrange(max(len(lines) - 30, 1))
        cut = start + self.rng.randint(2, 8)
        return "\n".join(lines[start:cut]) + "\n", "\n".join(lines[cut : cut + 20]), []
