"""Logprobs of tokens that hold part of a character (a byte-fallback tokenizer splits CJK and
emoji into byte tokens): their bytes rebuild the text, as OpenAI's docs say they do, and no
two tokens share a name. Reference: the text's own UTF-8."""

import pytest

from serving.api.openai.format import TextOffsets, chat_logprobs, completion_logprobs
from serving.engine.request import TokenLogprob
from serving.model.tokenizer import load_tokenizer
from tests.serving.model.hf_folders import save_tokenizer

TEXT = "ab 😀 日本 é!"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(save_tokenizer(tmp_path_factory.mktemp("tok"), "byte_fallback_bpe"))


def logprobs(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    # the runner-up of each position: another token (the next one in the text, or the first)
    return ids, [
        TokenLogprob(i, -0.5, top=((i, -0.5), (ids[(k + 1) % len(ids)], -1.5)))
        for k, i in enumerate(ids)
    ]


def test_chat_bytes_rebuild_the_text_and_partial_tokens_are_named_by_their_bytes(tokenizer):
    _ids, lps = logprobs(tokenizer)
    content = chat_logprobs(tokenizer, lps)["content"]
    joined = b"".join(bytes(entry["bytes"]) for entry in content)
    assert joined.decode("utf-8").lstrip(" ") == TEXT
    partial = [e for e in content if e["token"].startswith("bytes:")]
    assert len(partial) >= 4  # the emoji and the CJK characters arrive in byte tokens
    for e in partial:
        assert e["token"] == "bytes:" + "".join(f"\\x{b:02x}" for b in e["bytes"])
        assert all(len(t["bytes"]) for t in e["top_logprobs"])


def test_completion_top_logprobs_keep_every_candidate_and_offsets_point_into_the_text(tokenizer):
    ids, lps = logprobs(tokenizer)
    out = completion_logprobs(tokenizer, lps)
    text = b"".join(tokenizer.token_bytes(i) for i in ids).decode("utf-8")
    for k, top in enumerate(out["top_logprobs"]):
        assert len(top) == (1 if ids[(k + 1) % len(ids)] == ids[k] else 2)
    for token, at in zip(out["tokens"], out["text_offset"], strict=True):
        if not token.startswith("bytes:"):  # a whole token is the text at its offset
            assert text[at : at + len(token)] == token
    assert out["text_offset"] == sorted(out["text_offset"])


def test_offsets_carried_across_chunks_equal_the_whole_answers(tokenizer):
    _ids, lps = logprobs(tokenizer)
    whole = completion_logprobs(tokenizer, lps)["text_offset"]
    for size in (1, 2, 3, 5):
        offsets = TextOffsets()
        streamed = [
            at
            for k in range(0, len(lps), size)
            for at in completion_logprobs(tokenizer, lps[k : k + size], offsets)["text_offset"]
        ]
        assert streamed == whole


def test_a_stray_byte_counts_before_the_token_that_shows_it_was_stray(tokenizer):
    ids = tokenizer.encode("a日b", add_special_tokens=False)
    raws = [tokenizer.token_bytes(i) for i in ids]
    middle = next(k for k, raw in enumerate(raws) if raw and raw[0] & 0xC0 == 0x80)
    del ids[middle]  # 日's bytes lose one: the rest are one invalid run
    text = tokenizer.decode(ids)
    out = completion_logprobs(tokenizer, [TokenLogprob(i, -1.0) for i in ids])
    assert text.endswith("\ufffdb")
    assert out["tokens"][-1] == "b" and out["text_offset"][-1] == len(text) - 1
