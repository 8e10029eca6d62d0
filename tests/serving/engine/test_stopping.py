"""StopChecker over a real byte-level BPE tokenizer: stop tokens, stop strings, the length cap.

The texts decode token by token into whole words, single bytes and multi-byte characters
split across byte tokens, so stop strings land on, across and inside token boundaries.
"""

import random

import pytest

from serving.engine.request import SamplingParams
from serving.engine.stopping import StopChecker
from serving.model.tokenizer import load_tokenizer
from tests.serving.model.hf_folders import save_tokenizer

FOX = "the quick brown fox jumps over the lazy dog"  # ['the', ' quick', ' brown', ' fox', ...]
TEXTS = [FOX, "zebras 🦓 graze: ünïcödé ok", "Hello, world! This is a test.", "the quick 🦊 jumped"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(save_tokenizer(tmp_path_factory.mktemp("tok"), "byte_level_bpe"))


def _checker(tok, max_tokens=100, **params):
    return StopChecker(SamplingParams(**params), tok.eos_token_ids, max_tokens, tok.decode_stream())


def _feed(checker, ids):
    """Feed ids until a finish: (the text emitted after each token, finish reason)."""
    pieces = []
    for n, token_id in enumerate(ids, start=1):
        text, reason = checker.add(token_id, n)
        pieces.append(text)
        if reason is not None:
            return pieces, reason
    return pieces, None


def _ids(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    return ids


def test_no_stop_emits_the_whole_text(tok):
    for text in TEXTS:
        pieces, reason = _feed(_checker(tok), _ids(tok, text))
        assert reason is None and "".join(pieces) == text


def test_eos_stops_and_adds_no_text(tok):
    eos = tok.eos_token_ids[0]
    pieces, reason = _feed(_checker(tok), [*_ids(tok, FOX), eos, *_ids(tok, " more")])
    assert reason == "stop" and "".join(pieces) == FOX
    assert len(pieces) == len(_ids(tok, FOX)) + 1


def test_ignore_eos_keeps_going(tok):
    eos = tok.eos_token_ids[0]
    ids = [*_ids(tok, "the quick"), eos, *_ids(tok, " brown")]
    pieces, reason = _feed(_checker(tok, ignore_eos=True), ids)
    assert reason is None and "".join(pieces) == "the quick brown"  # EOS is special: no text


def test_stop_token_id_is_not_emitted(tok):
    ids = _ids(tok, FOX)
    pieces, reason = _feed(_checker(tok, stop_token_ids=(ids[3],)), ids)  # ' fox'
    assert reason == "stop" and "".join(pieces) == "the quick brown"
    assert len(pieces) == 4


def test_stop_token_flushes_a_held_back_character(tok):
    ids = _ids(tok, "the quick 🦊 jumped")
    eos = tok.eos_token_ids[0]
    pieces, reason = _feed(_checker(tok), [*ids[:3], eos])  # ' ' + the fox's first byte
    assert reason == "stop" and "".join(pieces) == tok.decode(ids[:3])


@pytest.mark.parametrize("text", [FOX, "the quick 🦊 jumped"])
def test_length_emits_the_last_token_and_what_the_stream_holds(text, tok):
    ids = _ids(tok, text)
    for max_tokens in range(1, len(ids) + 1):
        pieces, reason = _feed(_checker(tok, max_tokens=max_tokens), ids)
        assert reason == "length" and len(pieces) == max_tokens
        assert "".join(pieces) == tok.decode(ids[:max_tokens])


def test_length_releases_a_partial_stop_string(tok):
    pieces, reason = _feed(_checker(tok, max_tokens=3, stop=("brown cow",)), _ids(tok, FOX))
    assert reason == "length" and "".join(pieces) == "the quick brown"


def test_a_possible_stop_string_is_held_back_until_ruled_out(tok):
    pieces, reason = _feed(_checker(tok, stop=("brown cow",)), _ids(tok, FOX))
    assert reason is None and pieces[:4] == ["the", " quick", " ", "brown fox"]


@pytest.mark.parametrize("stop", ["k bro", "own f", "x jumps o", "🦓", "s 🦓 g", "ünï", "d!"])
def test_stop_string_across_tokens(stop, tok):
    text = next(t for t in TEXTS if stop in t)
    ids = _ids(tok, text)
    assert not any(stop in tok.decode([i]) for i in ids)  # it really spans tokens
    _check_stop_string(tok, text, stop)


def test_a_stop_string_before_a_partial_character_in_its_token_stops_on_that_token(tok):
    """Tokens such as b"na\\xc3" end a stop string and start the next character: the stop
    is seen on that token, not once the character completes."""
    by_bytes = {tok.token_bytes(i): i for i in range(tok.vocab_size)}
    checked = 0
    for token in range(tok.vocab_size):
        raw = tok.token_bytes(token)
        text = raw.decode("utf-8", errors="replace")
        if not text.endswith("\ufffd") or not text.rstrip("\ufffd").strip():
            continue
        lead = max(k for k, byte in enumerate(raw) if byte >= 0xC0)
        missing = (2 if raw[lead] < 0xE0 else 3 if raw[lead] < 0xF0 else 4) - (len(raw) - lead)
        ids = [by_bytes[b"x"], token, *[by_bytes[b"\xa0"]] * missing]  # completes it
        if "\ufffd" in tok.decode(ids):
            continue
        _check_stop_string(tok, tok.decode(ids), text.rstrip("\ufffd")[-1], ids)
        checked += 1
    assert checked >= 5


def test_stop_string_at_random_places(tok):
    rng = random.Random(0)
    for text in TEXTS:
        for _ in range(40):
            start = rng.randrange(len(text))
            _check_stop_string(tok, text, text[start : start + rng.randint(1, 8)])


def _check_stop_string(tok, text, stop, ids=None):
    """The stream is cut right before the stop string and never shows any of it, and it
    stops on the token that completes the stop string in the decoded text, not later."""
    expected, ids = text[: text.find(stop)], ids or _ids(tok, text)
    pieces, reason = _feed(_checker(tok, stop=(stop,)), ids)
    assert reason == "stop", stop
    assert len(pieces) == next(k for k in range(len(ids) + 1) if stop in tok.decode(ids[:k]))
    emitted = ""
    for piece in pieces:
        emitted += piece
        assert expected.startswith(emitted), (stop, emitted)
    assert emitted == expected, stop


@pytest.mark.parametrize(
    "stops, expected",
    [
        (("lazy", "quick"), "the "),  # the earlier in the text wins, not the first listed
        (("jumps", "fox jumps"), "the quick brown "),  # both complete together: earliest start
        (("brown fox", "own"), "the quick br"),  # "own" completes first, a token earlier
        (("the",), ""),
    ],
)
def test_several_stop_strings(stops, expected, tok):
    pieces, reason = _feed(_checker(tok, stop=stops), _ids(tok, FOX))
    assert reason == "stop" and "".join(pieces) == expected


def test_stop_string_beats_length_on_the_same_token(tok):
    pieces, reason = _feed(_checker(tok, max_tokens=3, stop=("own",)), _ids(tok, FOX))
    assert reason == "stop" and "".join(pieces) == "the quick br"


def test_add_after_finish_is_an_error(tok):
    checker = _checker(tok, max_tokens=1)
    assert checker.add(_ids(tok, "the")[0], 1) == ("the", "length")
    with pytest.raises(RuntimeError):
        checker.add(_ids(tok, " quick")[0], 2)
