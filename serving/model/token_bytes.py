"""Each token's own bytes in the text: what OpenAI's logprobs report per token.

Decoding a token alone loses them when it holds part of a multi-byte character (one emoji
is often three tokens): each decodes to U+FFFD. The bytes come from the vocabulary instead,
read the way the tokenizer's decoder reads it:

    byte-level BPE (GPT-2, Llama 3, Qwen)   each character of the token stands for one byte
    byte fallback (Llama 2, Mistral)       <0xHH> is the byte HH; "▁" is a space
    added tokens                           their text
"""

from __future__ import annotations

import json
import re

import tokenizers

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes_table(backend: tokenizers.Tokenizer) -> list[bytes]:
    """bytes of every id of backend's vocabulary, added tokens included."""
    decoder = json.dumps(json.loads(backend.to_str()).get("decoder"))
    byte_level = '"ByteLevel"' in decoder  # alone or inside a Sequence
    added = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
    table = [b""] * backend.get_vocab_size(with_added_tokens=True)
    for token, i in backend.get_vocab(with_added_tokens=True).items():
        table[i] = _bytes(token, added.get(i), byte_level)
    return table


def _bytes(token: str, added: str | None, byte_level: bool) -> bytes:
    if added is not None:
        return added.encode("utf-8")
    if byte_level and all(c in _UNICODE_TO_BYTE for c in token):
        return bytes(_UNICODE_TO_BYTE[c] for c in token)
    m = _BYTE_TOKEN.fullmatch(token)
    if m is not None:
        return bytes([int(m[1], 16)])
    return token.replace("\u2581", " ").encode("utf-8")


def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: printable bytes stand for themselves, the other
    bytes for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    chars = dict(zip(printable, printable, strict=True))
    others = (b for b in range(256) if b not in chars)
    chars |= {b: 256 + n for n, b in enumerate(others)}
    return {chr(c): b for b, c in chars.items()}


_UNICODE_TO_BYTE = _unicode_to_byte()
