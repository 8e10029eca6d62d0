"""Streamed decoding: a sequence's text one id at a time, the pieces joining to exactly the
whole decode; and transformers' clean-up of spaces, which both apply."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serving.model.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"  # what decoding yields for an incomplete UTF-8 sequence
_CLEANUP_HOLD = 8  # characters a streamed clean-up holds back: the longest rule, chained


class DecodeStream:
    """Decode ids one at a time for streaming; the pieces join to exactly decode(all ids).

    Each step decodes a short window: a few already-emitted ids for context (so word-leading
    spaces and merges come out as in the whole text), then the new ids. The end of a piece
    that is inside a multi-byte character (decoded as U+FFFD) is held back until the ids that
    complete it arrive; the characters before it go out at once, so a stop string among them
    is seen on its own token. finish() releases whatever is still held. One honest exception:
    ids whose bytes are not valid UTF-8 (a model may generate a stray byte token) can come
    out with U+FFFD counted differently from the whole decode, as with tokenizers' own
    DecodeStream: text already sent cannot be taken back. A tokenizer that cleans up spaces
    (" ." -> ".") holds back the last few characters too, since the next id may remove one.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # window start: context ids before _read, already emitted
        self._read = 0  # ids before this are emitted
        self._partial = 0  # characters after _prefix_text already sent while _read waits
        self._prefix_text = ""  # decode(ids[_prefix:_read]), before any clean-up
        self._raw = ""  # all text so far before clean-up, kept only when cleaning up
        self._released = 0  # characters of the cleaned text returned so far

    def step(self, token_id: int) -> str:
        """The new text that token_id completes; "" while nothing new can be shown yet."""
        self._ids.append(token_id)
        text = self._decode(self._ids[self._prefix :])
        sent = len(self._prefix_text) + self._partial
        if len(text) <= sent:
            return ""
        if text.endswith(_REPLACEMENT):  # the characters before the incomplete one are final
            piece = text.rstrip(_REPLACEMENT)[sent:]
            self._partial += len(piece)
            return self._release(piece, final=False) if piece else ""
        return self._release(self._emit(text), final=False)

    def finish(self) -> str:
        """Whatever text is still held back (a trailing U+FFFD included), at end of sequence."""
        text = self._decode(self._ids[self._prefix :])
        sent = len(self._prefix_text) + self._partial
        piece = self._emit(text) if len(text) > sent else ""
        return self._release(piece, final=True)

    def _release(self, piece: str, final: bool) -> str:
        if not self._tokenizer.cleans_up_spaces:
            return piece
        # Clean-up only deletes a space before punctuation or a contraction, so text more
        # than _CLEANUP_HOLD characters from the end can no longer change.
        self._raw += piece
        text = clean_up(self._raw)
        end = len(text) if final else max(len(text) - _CLEANUP_HOLD, self._released)
        out, self._released = text[self._released : end], end
        return out

    def _emit(self, text: str) -> str:
        piece = text[len(self._prefix_text) + self._partial :]
        self._partial = 0
        # The emitted ids become the next window's context, unless they decode to nothing
        # alone (skipped special tokens): a window must start with visible text, or a
        # decoder that strips the text's first space would strip the next word's.
        context = self._decode(self._ids[self._read :])
        if context:
            self._prefix, self._prefix_text = self._read, context
        else:
            self._prefix_text = text
        self._read = len(self._ids)
        return piece

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer._decode(ids, self._skip)


def clean_up(text: str) -> str:
    """transformers' clean_up_tokenization: no space before punctuation and contractions."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                          (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                          (" 're", "'re")):  # fmt: skip
        text = text.replace(before, after)
    return text
