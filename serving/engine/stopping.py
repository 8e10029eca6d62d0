"""When a sequence stops, and which of its text may be streamed out so far.

One StopChecker per sequence turns each new token into (text to emit, finish reason):

    "stop"    the token is an EOS id (unless ignore_eos) or one of stop_token_ids; that token
              adds no text. Or the text now contains a stop string: the text is cut before it.
    "length"  the sequence has max_tokens output tokens; its last token's text is emitted.

Stop strings can span tokens, so the checker holds back the longest tail of the text that is
still the beginning of some stop string, and releases it once it can no longer be one. Text
that has been emitted never has to be taken back. The first stop string to complete wins;
when several complete on the same token, the one that starts earliest in the text wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serving.engine.request import SamplingParams
from serving.model.decode_stream import DecodeStream


@dataclass
class StopChecker:
    """Stop conditions and stop-string-safe streaming of one sequence's text."""

    params: SamplingParams
    eos_token_ids: tuple[int, ...]
    max_tokens: int  # already capped by the engine to what fits in max_model_len
    stream: DecodeStream  # from tokenizer.decode_stream()
    finish_reason: str | None = field(default=None, init=False)
    _pending: str = field(default="", init=False)  # decoded, not emitted: a stop string's start?

    def __post_init__(self) -> None:
        # an empty stop string would match before any text; ignoring it is the only sane reading
        self._stops = tuple(s for s in self.params.stop if s)
        self._stop_ids = frozenset(self.params.stop_token_ids)
        self._eos_ids = frozenset(() if self.params.ignore_eos else self.eos_token_ids)

    def add(self, token_id: int, num_output_tokens: int) -> tuple[str, str | None]:
        """Feed the new token; return (text to emit now, finish reason or None).

        num_output_tokens counts the generated tokens including this one.
        """
        if self.finish_reason is not None:
            raise RuntimeError(f"sequence already finished ({self.finish_reason})")
        if token_id in self._eos_ids or token_id in self._stop_ids:
            reason: str | None = "stop"  # the stop token itself is never decoded
        else:
            self._pending += self.stream.step(token_id)
            reason = "length" if num_output_tokens >= self.max_tokens else None
        if reason is not None:  # the stream's held-back bytes may complete a stop string too
            self._pending += self.stream.finish()

        cut = self._find_stop()
        if cut is not None:
            if reason is None:
                self.stream.finish()  # nothing after the stop string is emitted
            text, reason = self._pending[:cut], "stop"
        elif reason is not None:
            text = self._pending
        else:
            keep = self._partial_stop_len()
            text = self._pending[: len(self._pending) - keep]
            self._pending = self._pending[len(text) :]
            return text, None
        self._pending = ""
        self.finish_reason = reason
        return text, reason

    def end(self) -> str:
        """Finish with "stop" now (the output is complete): the text still held back."""
        text = self._pending + self.stream.finish()
        self._pending, self.finish_reason = "", "stop"
        return text

    def _find_stop(self) -> int | None:
        """Where in the pending text the earliest complete stop string starts, or None."""
        hits = [i for i in (self._pending.find(s) for s in self._stops) if i >= 0]
        return min(hits) if hits else None

    def _partial_stop_len(self) -> int:
        """Length of the longest tail of the pending text that begins some stop string."""
        text, best = self._pending, 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
