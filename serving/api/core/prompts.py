"""Prompts to token ids, and sampling fields to SamplingParams, with 400s for what cannot run.

Chats go through the model's chat template and are tokenized without added special tokens
(the template writes them), as transformers does, except that a special token's text inside
a message stays text (serving/model/chat_encoding.py); raw text gets the tokenizer's own (BOS).

Rendering and tokenizing take time in proportion to the text, so they run in worker threads,
never on the event loop, and only after a cheap cap on characters: no token spans more than
MAX_CHARS_PER_TOKEN characters, so a longer text could not fit model.max_model_len tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from starlette.concurrency import run_in_threadpool

from adapters.errors import quoted
from serving.api.core.errors import ApiError
from serving.api.core.messages import ChatMessage
from serving.api.core.settings import AppSettings
from serving.engine.request import SamplingParams
from serving.model.chat_encoding import encode_chat
from serving.model.errors import ChatTemplateError

# Generous: the longest tokens of common vocabularies (runs of spaces, dashes) are far shorter.
MAX_CHARS_PER_TOKEN = 32


async def chat_ids(
    settings: AppSettings,
    messages: Sequence[ChatMessage],
    field: str = "messages",
    tools: list[dict] | None = None,
) -> list[int]:
    """The token ids of a chat rendered by the chat template (with the functions of tools
    offered), ready for the reply; field names what the client sent, for errors."""
    chat = [m.turn() for m in messages]
    # what the template writes besides the contents: calls, their ids, a tool's name
    extras = [{k: v for k, v in t.items() if k not in ("role", "content")} for t in chat]
    structured = json.dumps([tools, extras]) if tools or any(extras) else ""
    _cap_chars(settings, sum(len(t["content"]) for t in chat) + len(structured), field)
    # a call or a function is rendered as the template writes it, text and all: a special
    # token's text there would become the token
    special = next((s for s in settings.tokenizer.special_texts if s in structured), None)
    if special is not None:
        raise ApiError(400, f"tools and tool calls may not hold the text {special!r}, one of "
                            "the model's special tokens", param="tools")  # fmt: skip
    ids = await run_in_threadpool(_render_and_encode, settings, chat, tools)
    return checked(settings, ids)


async def text_ids(settings: AppSettings, text: str) -> list[int]:
    """The token ids of raw text."""
    _cap_chars(settings, len(text), "prompt")
    ids = await run_in_threadpool(settings.tokenizer.encode, text, add_special_tokens=True)
    return checked(settings, ids)


def _render_and_encode(
    settings: AppSettings, chat: list[dict], tools: list[dict] | None = None
) -> list[int]:
    try:
        return encode_chat(settings.tokenizer, chat, tools=tools)
    except ChatTemplateError as exc:
        raise ApiError(400, str(exc)) from None


def _cap_chars(settings: AppSettings, num_chars: int, what: str) -> None:
    limit = settings.max_model_len * MAX_CHARS_PER_TOKEN
    if num_chars > limit:
        raise ApiError(
            400,
            # OpenAI's opening words: clients (litellm) tell this error by them
            f"This model's maximum context length is {settings.max_model_len} tokens. However, "
            f"the {what} holds {num_chars} characters, more than the limit of {limit} "
            f"(model.max_model_len {settings.max_model_len} tokens x {MAX_CHARS_PER_TOKEN})",
            code="context_length_exceeded",
        )


def given_ids(settings: AppSettings, ids: Sequence[int]) -> list[int]:
    """Token ids sent by the client, each checked to be one the model embeds."""
    ids = checked(settings, ids)  # the count first: a long list is refused before it is scanned
    limit = settings.num_token_ids
    bad = next((i for i in ids if not 0 <= i < limit), None)
    if bad is not None:
        raise ApiError(
            400,
            f"prompt: token id {quoted(bad)} is outside the vocabulary (0..{limit - 1})",
            param="prompt",
        )
    return ids


def checked(settings: AppSettings, ids: Sequence[int]) -> list[int]:
    """ids, or a 400 naming the counts when no output token would fit after them."""
    if not ids:
        raise ApiError(400, "the prompt is empty")
    if len(ids) >= settings.max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {settings.max_model_len} tokens. However, "
            f"the prompt has {len(ids)} tokens, which leaves no room for output (the prompt "
            "and the output share the context)",
            code="context_length_exceeded",
        )
    return list(ids)


def sampling(
    body,
    settings: AppSettings,
    *,
    max_tokens: int | None,
    default_temperature: float,
    stop: tuple[str, ...] = (),
    logprobs: int | None = None,
) -> SamplingParams:
    """SamplingParams from a validated body's shared fields (schemas.SamplingFields).

    Without max_tokens the output may fill the context: the engine caps every request at
    max_model_len and reports finish_reason "length" when the cap stops it.
    """

    def pick(value, default):
        return default if value is None else value

    return SamplingParams(
        max_tokens=pick(max_tokens, settings.max_model_len),
        temperature=pick(body.temperature, default_temperature),
        top_p=pick(body.top_p, 1.0),
        top_k=pick(body.top_k, 0),
        seed=body.seed,
        repetition_penalty=pick(body.repetition_penalty, 1.0),
        frequency_penalty=pick(body.frequency_penalty, 0.0),
        presence_penalty=pick(body.presence_penalty, 0.0),
        stop=stop,
        logprobs=logprobs,
        **_openai_extras(body, settings),
    )


def _openai_extras(body, settings: AppSettings) -> dict:
    """The OpenAI routes' logit_bias and vLLM's min_p, stop_token_ids and ignore_eos, each
    id checked to be one the model embeds; nothing for a Workers-AI body, which has none."""
    if not hasattr(body, "logit_bias"):
        return {}
    limit = settings.num_token_ids
    bias, stops = body.biases(), tuple(body.stop_token_ids or ())
    for name, ids in (("logit_bias", [i for i, _ in bias]), ("stop_token_ids", stops)):
        bad = next((i for i in ids if not 0 <= i < limit), None)
        if bad is not None:
            raise ApiError(400, f"{name}: token id {bad} is outside the vocabulary "
                                f"(0..{limit - 1})", param=name)  # fmt: skip
    return {"logit_bias": bias, "min_p": body.min_p or 0.0, "stop_token_ids": stops,
            "ignore_eos": body.ignore_eos}  # fmt: skip
