"""OpenAI response objects: chat.completion(.chunk) and text_completion, usage, logprobs."""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Mapping, Sequence

from serving.api.core.generation import Outcome
from serving.api.core.tools import ToolPlan
from serving.engine.request import RequestOutput, TokenLogprob
from serving.model.tokenizer import Tokenizer
from serving.model.tool_parse import ToolCall

# The engine's reasons that OpenAI has no word for: an abort never reaches a client that
# is still there, and errors are answered as errors.
FINISH_REASONS = {"stop": "stop", "length": "length"}


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def summed_usage(parts: Mapping[int, Outcome | RequestOutput], n: int) -> dict:
    """The usage of choices {index: outcome} (prompt p's j-th of n at index p*n + j): every
    completion, and each prompt once, as its first choice (j = 0) counted it."""
    firsts = [p for k, p in parts.items() if k % n == 0]
    return usage(sum(p.prompt_tokens for p in firsts),
                 sum(p.completion_tokens for p in parts.values()),
                 sum(p.cached_tokens for p in firsts))  # fmt: skip


def finish_reason(reason: str | None) -> str | None:
    return None if reason is None else FINISH_REASONS.get(reason, "stop")


def chat_logprobs(tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob]) -> dict:
    """Chat's {"content": [{token, logprob, bytes, top_logprobs}]}."""

    def entry(token_id: int, logprob: float) -> dict:
        raw = tokenizer.token_bytes(token_id)
        return {"token": token_text(raw), "logprob": logprob, "bytes": list(raw)}

    return {
        "content": [
            {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
            for lp in logprobs
        ]
    }


class TextOffsets:
    """text_offset of each token of one completion, carried across a stream's chunks.

    A token's offset counts the characters of the text whose bytes all come before it: one
    that ends or continues a multi-byte character points at that character, and a stray
    byte's U+FFFD is counted before the token that shows it was stray. Held bytes carry from
    chunk to chunk, so a stream's offsets equal the whole answer's.
    """

    def __init__(self) -> None:
        self._chars = 0  # characters complete so far
        self._held = b""  # bytes after them: the start of a character not yet complete

    def take(self, raw: bytes) -> int:
        """The offset of the token whose bytes are raw; the next token's follows it."""
        held, ends = len(self._held), []
        tail = self._held + raw
        at = _char_ends(tail, ends)
        before = sum(1 for end in ends if end <= held)
        offset = self._chars + before
        self._chars, self._held = self._chars + len(ends), tail[at:]
        return offset


def _char_ends(data: bytes, ends: list[int]) -> int:
    """Append where each character of data ends (an invalid run is one U+FFFD, as the
    tokenizer's decode has it); return how many bytes they take: the rest may still be the
    start of a character."""
    at = 0
    while True:
        try:
            text, _ = codecs.utf_8_decode(data[at:], "strict", False)
        except UnicodeDecodeError as bad:  # the valid characters, then the invalid run
            text, bad_end = data[at : at + bad.start].decode("utf-8"), at + bad.end
        else:
            bad_end = None
        for char in text:
            at += len(char.encode("utf-8"))
            ends.append(at)
        if bad_end is None:
            return at
        at = bad_end
        ends.append(at)


def completion_logprobs(
    tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob], offsets: TextOffsets | None = None
) -> dict:
    """Completions' {tokens, token_logprobs, top_logprobs, text_offset}; offsets carries a
    stream's count from chunk to chunk (None: these are the whole completion's tokens)."""
    raws = [tokenizer.token_bytes(lp.token_id) for lp in logprobs]
    offsets = TextOffsets() if offsets is None else offsets
    return {
        "tokens": [token_text(raw) for raw in raws],
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [
            {token_text(tokenizer.token_bytes(t)): v for t, v in lp.top} for lp in logprobs
        ],
        "text_offset": [offsets.take(raw) for raw in raws],
    }


def chat_completion(
    rid: str,
    model: str,
    outcomes: Sequence[Outcome],
    logprobs: Sequence[dict | None],
    n: int,
    plan: ToolPlan | None = None,
) -> dict:
    """One choice per outcome, in order (n per prompt); usage summed over them. plan: the
    request's tools, by which each answer is read into content and calls."""

    def choice(outcome: Outcome) -> dict:
        content, calls = plan.read(outcome.text) if plan else (outcome.text, [])
        message = {"role": "assistant", "content": content}
        reason = finish_reason(outcome.finish_reason)
        if calls:
            message["tool_calls"] = [tool_call(c, plan.call_id()) for c in calls]
            reason = "tool_calls" if reason == "stop" else reason
        return {"message": message, "finish_reason": reason}

    return _completed("chat.completion", rid, model, outcomes, logprobs, n, choice)


def tool_call(call: ToolCall, cid: str) -> dict:
    """A call in a chat answer, as OpenAI gives it."""
    return {"id": cid, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}  # fmt: skip


def text_completion(
    rid: str, model: str, outcomes: Sequence[Outcome], logprobs: Sequence[dict | None], n: int
) -> dict:
    """One choice per outcome, in order (n per prompt); usage summed over them."""

    def choice(outcome: Outcome) -> dict:
        return {"text": outcome.text, "finish_reason": finish_reason(outcome.finish_reason)}

    return _completed("text_completion", rid, model, outcomes, logprobs, n, choice)


def chat_chunk(rid: str, created: int, model: str, choices: list[dict], **extra) -> dict:
    return _envelope("chat.completion.chunk", rid, created, model, choices, **extra)


def completion_chunk(rid: str, created: int, model: str, choices: list[dict], **extra) -> dict:
    return _envelope("text_completion", rid, created, model, choices, **extra)


def _completed(
    kind: str,
    rid: str,
    model: str,
    outcomes: Sequence[Outcome],
    logprobs: Sequence[dict | None],
    n: int,
    choice: Callable[[Outcome], dict],
) -> dict:
    """A whole answer: choice k is outcome k as choice(outcome) puts it; usage summed."""
    choices = [
        {"index": k, **choice(outcome), "logprobs": lp}
        for k, (outcome, lp) in enumerate(zip(outcomes, logprobs, strict=True))
    ]
    summed = summed_usage(dict(enumerate(outcomes)), n)
    return _envelope(kind, rid, now(), model, choices, usage=summed)


def _envelope(kind: str, rid: str, created: int, model: str, choices: list[dict], **extra) -> dict:
    """An OpenAI response object: id, object (kind), created, model, choices, then extra."""
    return {
        "id": rid,
        "object": kind,
        "created": created,
        "model": model,
        "choices": choices,
        **extra,
    }


def token_text(raw: bytes) -> str:
    """A token's bytes as its text, or, part of a character, as OpenAI writes such a token:
    'bytes:\\xf0\\x9f' (distinct per token, where the text would be U+FFFD for each)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
