"""A model's tokenizer, read from its Hugging Face folder without transformers.

tokenizer.json (the `tokenizers` library's file) does the encoding and decoding;
tokenizer_config.json names the special tokens and may carry the chat template, which
chat_template.jinja overrides; generation_config.json may add stop tokens. The choices follow
transformers 5 (`TokenizersBackend`), so ids and text match `AutoTokenizer`: tokenizer.json's
post-processor alone decides what add_special_tokens adds, and clean_up_tokenization_spaces is
ignored for BPE models as transformers 5 ignores it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import tokenizers

from serving.model.chat_template import compile_chat_template, render_chat_template
from serving.model.decode_stream import DecodeStream, clean_up
from serving.model.errors import ChatTemplateError, ModelLoadError
from serving.model.hf_config import read_eos_token_ids
from serving.model.token_bytes import token_bytes_table
from serving.model.tool_formats import MARKERS

# the named special tokens transformers exposes to chat templates
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")  # fmt: skip


class Tokenizer:
    """Text <-> token ids for one model, plus its chat template and stop tokens."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        special_tokens: Mapping[str, str],
        chat_template: str | None = None,
        extra_eos_token_ids: Sequence[int] = (),
        clean_up_spaces: bool = False,
    ) -> None:
        self._backend = backend
        self._backend.no_truncation()  # a tokenizer.json may carry a training-time limit
        self._backend.no_padding()
        missing = [t for t in special_tokens.values() if backend.token_to_id(t) is None]
        if missing:  # transformers adds named special tokens that tokenizer.json lacks
            self._backend.add_special_tokens(
                [tokenizers.AddedToken(t, special=True) for t in missing]
            )
        # The same tokenizer reading special tokens' text as plain text (encode_text): made on
        # first use, as only a chat content holding such text needs it
        self._as_text: tokenizers.Tokenizer | None = None
        self._token_bytes: list[bytes] | None = None  # made on first use (logprobs ask it)
        # The text of each added special token ('<|system|>', '<|end|>', ...)
        self.special_texts: tuple[str, ...] = tuple(
            t.content for t in backend.get_added_tokens_decoder().values() if t.special
        )
        # Special tokens that spell a tool call ([TOOL_CALLS]): kept in decoded text
        self.marker_ids: frozenset[int] = frozenset(
            i for i, t in backend.get_added_tokens_decoder().items()
            if t.special and t.content in MARKERS
        )  # fmt: skip
        self.special_tokens = dict(special_tokens)
        self.chat_template = chat_template
        # transformers 5 ignores the setting for BPE, where it would remove real spaces
        self.cleans_up_spaces = clean_up_spaces and type(backend.model).__name__ != "BPE"
        bos, eos = special_tokens.get("bos_token"), special_tokens.get("eos_token")
        self.bos_token_id: int | None = backend.token_to_id(bos) if bos else None
        eos_ids = [backend.token_to_id(eos)] if eos else []
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys([*eos_ids, *extra_eos_token_ids]))

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        """The tokenizer of a model folder (see load_tokenizer)."""
        return load_tokenizer(model_dir)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encoded_vocab(self) -> list[str]:
        """Each id's token as tokenizer.json spells it (byte-level BPE: its byte alphabet)."""
        vocab = [""] * self.vocab_size
        for token, i in self._backend.get_vocab(with_added_tokens=True).items():
            vocab[i] = token
        return vocab

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes in the text (serving.model.token_bytes); a token that is
        part of a multi-byte character has part of its bytes. An id past the vocabulary (a
        model's embedding may have more rows than its tokenizer has tokens) has none, as it
        decodes to nothing."""
        if self._token_bytes is None:
            self._token_bytes = token_bytes_table(self._backend)
        return self._token_bytes[token_id] if 0 <= token_id < len(self._token_bytes) else b""

    def special_token_ids(self) -> frozenset[int]:
        """The ids of added tokens marked special (never part of decoded text)."""
        added = self._backend.get_added_tokens_decoder()
        return frozenset(i for i, token in added.items() if token.special)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of text a client wrote, with no special token: '<|system|>' in it is
        those characters' ordinary tokens (nothing added either)."""
        as_text = self._as_text
        if as_text is None or not as_text.encode_special_tokens:  # a copy (pickle) loses it
            as_text = tokenizers.Tokenizer.from_str(self._backend.to_str())
            as_text.encode_special_tokens = True
            self._as_text = as_text
        return as_text.encode(text, add_special_tokens=False).ids

    def to_json(self) -> str:
        """The tokenizer as tokenizer.json text (its model, pre-tokenizer and decoder)."""
        return self._backend.to_str()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of text; add_special_tokens adds what the post-processor adds (e.g. BOS)."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ids; incomplete UTF-8 at either end decodes to U+FFFD."""
        text = self._decode(list(ids), skip_special_tokens)
        return clean_up(text) if self.cleans_up_spaces else text

    def _decode(self, ids: list[int], skip: bool) -> str:
        """ids' text; skip leaves out special tokens, but for the markers of tool calls."""
        if not skip or not self.marker_ids or self.marker_ids.isdisjoint(ids):  # most models: none
            return self._backend.decode(ids, skip_special_tokens=skip)
        pieces, run = [], []
        for i in ids:
            if i in self.marker_ids:
                pieces += [self._backend.decode(run, skip_special_tokens=True),
                           self._backend.id_to_token(i)]  # fmt: skip
                run = []
            else:
                run.append(i)
        return "".join(pieces) + self._backend.decode(run, skip_special_tokens=True)

    def decode_stream(self, skip_special_tokens: bool = True) -> DecodeStream:
        """A fresh incremental decoder for one generated sequence."""
        return DecodeStream(self, skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The prompt text for a chat, rendered as transformers renders it (not tokenized)."""
        if self.chat_template is None:
            raise ChatTemplateError("this model has no chat template; send a raw prompt instead")
        return render_chat_template(
            self.chat_template,
            list(messages),
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens,
            **kwargs,
        )


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    """The tokenizer of a model folder; ModelLoadError if tokenizer.json is missing or bad."""
    folder = Path(model_dir)
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder}: tokenizer.json not found (only fast tokenizers are read)")
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises plain Exception
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    config = _read_json(folder / "tokenizer_config.json")
    named = {k: config[k] for k in SPECIAL_TOKEN_NAMES if config.get(k) is not None}
    if "added_tokens_decoder" not in config:  # legacy: special_tokens_map.json overrides
        legacy = _read_json(folder / "special_tokens_map.json")
        named |= {k: legacy[k] for k in SPECIAL_TOKEN_NAMES if legacy.get(k) is not None}
    special = {k: v["content"] if isinstance(v, dict) else str(v) for k, v in named.items()}
    template = _chat_template(folder, config)
    return Tokenizer(
        backend,
        special,
        chat_template=template,
        extra_eos_token_ids=read_eos_token_ids(folder),
        clean_up_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
    )


def _chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")
    else:
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": ..., "template": ...}]: use "default"
            by_name = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = by_name.get("default")
    if template is None:
        return None
    try:
        compile_chat_template(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ModelLoadError(f"{folder}: chat template does not parse: {exc}") from None
    return template


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data
