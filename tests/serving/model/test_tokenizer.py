"""Tokenizer against transformers' AutoTokenizer on the same saved folder: ids, text, stream."""

import random

import pytest
import tokenizers
from transformers import AutoTokenizer

from serving.model.errors import ModelLoadError
from serving.model.tokenizer import Tokenizer, load_tokenizer
from tests.serving.model.hf_folders import (
    SAMPLES,
    TOKENIZERS,
    save_generation_config,
    save_tokenizer,
)


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def pair(request, tmp_path_factory):
    """(ours, transformers') tokenizer of one folder saved by transformers."""
    folder = save_tokenizer(tmp_path_factory.mktemp(request.param), request.param)
    return load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_transformers(pair, add_special_tokens):
    ours, ref = pair
    for text in [*SAMPLES, "".join(SAMPLES), ""]:
        expected = ref(text, add_special_tokens=add_special_tokens).input_ids
        assert ours.encode(text, add_special_tokens=add_special_tokens) == expected, text


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_matches_transformers(pair, skip_special_tokens):
    ours, ref = pair
    for text in SAMPLES:
        ids = ours.encode(text)
        expected = ref.decode(ids, skip_special_tokens=skip_special_tokens)
        assert ours.decode(ids, skip_special_tokens=skip_special_tokens) == expected


def test_special_token_ids(pair):
    ours, ref = pair
    assert ours.bos_token_id == ref.bos_token_id == ref.convert_tokens_to_ids("<s>")
    assert ours.eos_token_ids == (ref.eos_token_id,)
    assert ours.vocab_size == len(ref)


def _stream(tokenizer, ids, skip=True):
    stream = tokenizer.decode_stream(skip_special_tokens=skip)
    pieces = [stream.step(i) for i in ids]
    return pieces, stream.finish()


@pytest.mark.parametrize("skip", [True, False])
def test_stream_reproduces_decode_and_never_splits_a_character(pair, skip):
    ours, _ = pair
    for text in [*SAMPLES, "".join(SAMPLES)]:
        ids = ours.encode(text)
        pieces, rest = _stream(ours, ids, skip)
        assert "".join(pieces) + rest == ours.decode(ids, skip_special_tokens=skip)
        assert rest == "" and not any("\ufffd" in p for p in pieces)
    # the multi-byte tokens of the emoji do show up one piece per character at most
    pieces, _ = _stream(ours, ours.encode("😀🎉", add_special_tokens=False))
    assert "".join(pieces) == "😀🎉" and all(len(p) <= 2 for p in pieces)


def test_stream_on_random_sequences(pair):
    """Random mixes of encoded words and random whole-character ids, special tokens included.

    Byte tokens alone are left out: an invalid UTF-8 run may decode to a different number
    of U+FFFD in pieces than whole (see DecodeStream).
    """
    ours, _ = pair
    rng = random.Random(0)
    words = [w for text in SAMPLES for w in text.split(" ")] + list("é日😀\n")
    encoded = [ours.encode(w, add_special_tokens=False) for w in words]
    plain = [i for i in range(ours.vocab_size) if "\ufffd" not in ours.decode([i], False)]
    for _ in range(200):
        ids = []
        for _ in range(rng.randrange(1, 8)):
            ids += rng.choice(encoded) + [rng.choice(plain) for _ in range(rng.randrange(3))]
        for skip in (True, False):
            pieces, rest = _stream(ours, ids, skip)
            assert "".join(pieces) + rest == ours.decode(ids, skip_special_tokens=skip), ids


def test_generation_config_adds_stop_tokens(tmp_path):
    save_tokenizer(tmp_path, "byte_level_bpe")
    save_generation_config(tmp_path, [4, 2])
    assert load_tokenizer(tmp_path).eos_token_ids == (2, 4)
    assert Tokenizer.from_dir(tmp_path).eos_token_ids == (2, 4)


def test_special_tokens_missing_from_tokenizer_json_are_added(tmp_path):
    save_tokenizer(tmp_path, "byte_level_bpe", pad_token="<pad>")
    ours, ref = load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    assert ours.encode("a<pad>b") == ref("a<pad>b").input_ids
    assert ours.vocab_size == len(ref)


def test_missing_or_broken_tokenizer(tmp_path):
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json not found"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="cannot read"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("kind", ["unigram_metaspace", "byte_level_bpe"])
def test_clean_up_tokenization_spaces_as_transformers_5(tmp_path, kind):
    """Honoured for Unigram; ignored for BPE, where it would eat real spaces."""
    save_tokenizer(tmp_path, kind, clean_up_tokenization_spaces=True)
    ours, ref = load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    text = "the fox , isn't it ? yes . they 're here !"
    ids = ours.encode(text)
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    assert ("fox ," in ours.decode(ids)) == (kind == "byte_level_bpe")
    rng = random.Random(1)
    pieces = ["fox", " ,", " .", " ' ", " 's", " n't", " 're", " ?", "  ", "!", " 'm"]
    for _ in range(100):
        ids = ours.encode("".join(rng.choices(pieces, k=rng.randrange(1, 12))))
        assert "".join(_stream(ours, ids)[0]) + _stream(ours, ids)[1] == ours.decode(ids)


def test_token_bytes_join_to_the_texts_bytes(pair):
    """Each token's own bytes, joined, are the UTF-8 of the text transformers decodes: also
    where a token holds only part of a character (accents, CJK, emoji in byte tokens)."""
    ours, ref = pair
    for text in [*SAMPLES, "😀 日本語 é"]:
        ids = ours.encode(text, add_special_tokens=False)
        joined = b"".join(ours.token_bytes(i) for i in ids)
        decoded = ref.decode(ids, skip_special_tokens=False)
        # Metaspace decoders drop the space a first "▁" stands for: leading spaces aside.
        assert joined.decode("utf-8").lstrip(" ") == decoded.lstrip(" "), text
    assert ours.token_bytes(ours.eos_token_ids[0]) == b"</s>"
    # a model's embedding may have rows past the vocabulary: such an id decodes to nothing
    past = ours.vocab_size + 3
    assert ours.token_bytes(past) == b"" and ours.decode([past]) == ""


def test_a_tool_call_marker_stays_in_decoded_text(tmp_path):
    """[TOOL_CALLS] (Mistral's special token that opens calls) is kept in the text, streamed
    or whole, where other special tokens are left out."""
    folder = save_tokenizer(tmp_path, "byte_level_bpe")
    backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    backend.add_special_tokens([tokenizers.AddedToken("[TOOL_CALLS]", special=True)])
    backend.save(str(folder / "tokenizer.json"))
    tok = load_tokenizer(folder)
    marker = backend.token_to_id("[TOOL_CALLS]")
    ids = [backend.token_to_id("<s>"), marker, *tok.encode(' [{"name": "f"}]', False)]
    assert tok.marker_ids == {marker}
    assert tok.decode(ids) == '[TOOL_CALLS] [{"name": "f"}]'
    stream = tok.decode_stream()
    assert "".join(stream.step(i) for i in ids) + stream.finish() == tok.decode(ids)
    assert tok.decode(ids, skip_special_tokens=False).startswith("<s>[TOOL_CALLS]")
