"""The prompt's part of an answer: `echo` on /v1/completions (OpenAI's legacy API, as vLLM
serves it) and vLLM's `prompt_logprobs` on both routes.

    echo:            text = prompt + completion; logprobs = {tokens, token_logprobs,
                     top_logprobs, text_offset} of the prompt's tokens then the completion's,
                     the first prompt token's logprob and top_logprobs null
    prompt_logprobs: [null, {"<token id>": {"logprob", "rank", "decoded_token"}, ...}, ...]:
                     per prompt token, itself and its top-n (ranked 1..n)

The engine scores the prompt once, with the larger top-n either field asks for (see
CompletionRequest.num_prompt_logprobs); each field shows its own n of it.
"""

from __future__ import annotations

from collections.abc import Sequence

from serving.api.openai.format import TextOffsets, token_text
from serving.engine.request import TokenLogprob
from serving.model.tokenizer import Tokenizer


class PromptPart:
    """What each choice of one /v1/completions answer shows of its prompt (choice k is of
    prompt k // n): its text and logprobs with echo, vLLM's prompt_logprobs when asked."""

    def __init__(self, tokenizer: Tokenizer, body, prompts: list, ids: list[list[int]]):
        self.tokenizer, self.body, self.ids = tokenizer, body, ids
        self.texts = [prompt_text(tokenizer, p) for p in prompts] if body.echo else None

    def text(self, k: int) -> str:
        """Choice k's echoed prompt ("" without echo)."""
        return self.texts[k // self.body.n] if self.texts else ""

    def logprobs(
        self, k: int, scored: Sequence[TokenLogprob | None], offsets: TextOffsets
    ) -> dict | None:
        """Choice k's prompt share of its logprobs; None without echo or logprobs."""
        if not self.texts or self.body.logprobs is None:
            return None
        return echo_logprobs(self.tokenizer, self.ids[k // self.body.n], scored,
                             self.body.logprobs, offsets)  # fmt: skip

    def extras(self, scored: Sequence[TokenLogprob | None]) -> dict:
        """A choice's prompt_logprobs field, when the body asks for it."""
        n = self.body.prompt_logprobs
        return {} if n is None else {"prompt_logprobs": prompt_logprobs(self.tokenizer, scored, n)}


def prompt_text(tokenizer: Tokenizer, prompt: str | list[int]) -> str:
    """The prompt as an echo shows it: the text sent, or the token ids sent, decoded."""
    return prompt if isinstance(prompt, str) else tokenizer.decode(prompt)


def echo_logprobs(
    tokenizer: Tokenizer,
    prompt_ids: Sequence[int],
    scored: Sequence[TokenLogprob | None],
    n: int,
    offsets: TextOffsets,
) -> dict:
    """The prompt's share of a completion's logprobs; offsets goes on into the completion's.

    A special token (BOS) shows as itself in `tokens` but takes no characters of the text,
    which echoes the prompt as sent: the offsets point into that text.
    """
    specials = tokenizer.special_token_ids()
    raws = [tokenizer.token_bytes(t) for t in prompt_ids]
    entries = list(scored) if scored else [None] * len(prompt_ids)
    return {
        "tokens": [token_text(raw) for raw in raws],
        "token_logprobs": [e.logprob if e is not None else None for e in entries],
        "top_logprobs": [
            {token_text(tokenizer.token_bytes(t)): v for t, v in e.top[:n]} if e else None
            for e in entries
        ],
        "text_offset": [
            offsets.take(b"" if t in specials else raw)
            for t, raw in zip(prompt_ids, raws, strict=True)
        ],
    }


def joined(first: dict, then: dict) -> dict:
    """Two logprobs objects of the completions shape, one after the other."""
    return {key: first[key] + then[key] for key in first}


def prompt_logprobs(
    tokenizer: Tokenizer, scored: Sequence[TokenLogprob | None], n: int
) -> list[dict | None]:
    """vLLM's prompt_logprobs: per prompt token, {token id: {logprob, rank, decoded_token}}
    of the token itself and its top-n; null for the first."""

    def entry(logprob: float, rank: int | None, token_id: int) -> dict:
        text = token_text(tokenizer.token_bytes(token_id))
        return {"logprob": logprob, "rank": rank, "decoded_token": text}

    out: list[dict | None] = []
    for e in scored:
        if e is None:
            out.append(None)
            continue
        ranked = {str(e.token_id): entry(e.logprob, e.rank, e.token_id)}
        for k, (t, v) in enumerate(e.top[:n]):
            ranked.setdefault(str(t), entry(v, k + 1, t))
        out.append(ranked)
    return out


def chat_extras(tokenizer: Tokenizer, body, outcomes: Sequence) -> dict:
    """A chat answer's prompt_logprobs, when asked: beside its choices, as vLLM puts them
    (the n choices share one prompt)."""
    n = body.prompt_logprobs
    if n is None or not outcomes:
        return {}
    return {"prompt_logprobs": prompt_logprobs(tokenizer, outcomes[0].prompt_logprobs, n)}
