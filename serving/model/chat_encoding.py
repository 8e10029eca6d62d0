"""A chat's token ids: the template's own text with its special tokens, each message's
content as the plain text its client wrote.

A message may hold the text of a special token ('<|end|>\\n<|system|>\\n...'). Encoded as
part of the rendered prompt, that text becomes the special tokens themselves, and a user
could close its own turn and open a system turn. Chats whose contents hold no such text are
encoded as transformers encodes them, the whole rendered prompt at once (the same ids). The
others are rendered with a placeholder for each content; the template's pieces are encoded
with their special tokens and each content as text (tokenizer.encode_text). A template that
trims a content (Llama-3's `| trim`) is seen by rendering once more with whitespace around
each placeholder, and the content is trimmed the same way; nothing else a template might do
to a content's text is done to such a content.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from serving.model.errors import ChatTemplateError
from serving.model.tokenizer import Tokenizer


def encode_chat(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
) -> list[int]:
    """ids of the rendered chat, the functions of tools offered; a special token's text
    inside a content is never that token."""
    kwargs = {"add_generation_prompt": add_generation_prompt, "tools": tools}
    text = tokenizer.apply_chat_template(messages, **kwargs)
    contents = [str(m.get("content", "")) for m in messages]
    specials = tokenizer.special_texts
    if not any(special in content for content in contents for special in specials):
        return tokenizer.encode(text, add_special_tokens=False)
    # Private-use characters and a random tag: neither a template nor a client writes them.
    tag = secrets.token_hex(8)
    marks = {f"\ue000{tag}.{i}\ue001": i for i in range(len(messages))}
    marked = [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)]
    rendered = tokenizer.apply_chat_template(marked, **kwargs)
    pieces = re.split("(" + "|".join(map(re.escape, marks)) + ")", rendered)
    if sorted(p for p in pieces if p in marks) != sorted(marks):
        raise ChatTemplateError(
            "a message holds the text of a special token, and this model's chat template "
            "does not write each message's content once as given, so it cannot be kept as text"
        )
    # Whitespace the template keeps on either side of each placeholder: where it is gone,
    # the template trims that side of the content (Jinja's trim is str.strip).
    pad = " \n"
    padded = [{**m, "content": f"{pad}{mark}{pad}"} for m, mark in zip(messages, marks)]
    probe = tokenizer.apply_chat_template(padded, **kwargs)
    ids: list[int] = []
    for piece in pieces:
        if piece in marks:
            content = contents[marks[piece]]
            if pad + piece not in probe:
                content = content.lstrip()
            if piece + pad not in probe:
                content = content.rstrip()
            ids += tokenizer.encode_text(content)
        elif piece:
            ids += tokenizer.encode(piece, add_special_tokens=False)
    return ids
