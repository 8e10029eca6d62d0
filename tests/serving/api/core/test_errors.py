"""Bad input of every kind gets a JSON error in its route's style, never a 5xx."""

import gzip
import json

import httpx
import pytest

from tests.serving.api.served import ACME, MAX_MODEL_LEN, MODEL_ID, serve

AUTH = {"Authorization": f"Bearer {ACME}"}
CHAT, DONE, AI = "/v1/chat/completions", "/v1/completions", f"/ai/run/{MODEL_ID}"
USER = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return {"model": MODEL_ID, "messages": USER, "max_tokens": 2, **fields}


def raw(content: bytes, content_type="application/json"):
    return {"content": content, "headers": {**AUTH, "content-type": content_type}}


def chunked(size: int):
    def body():
        for _ in range(size // 65536 + 1):
            yield b" " * 65536

    return {"content": body(), "headers": {**AUTH, "content-type": "application/json"}}


CASES = [  # id, method, path, request kwargs, status, part of the message
    ("unknown-model", "POST", CHAT, {"json": chat(model="gpt-5:x")}, 404, "does not exist"),
    ("unknown-adapter", "POST", DONE, {"json": {"model": "ghost", "prompt": "x"}}, 404,
     "unknown adapter 'ghost'"),
    ("unknown-adapter-lora", "POST", AI, {"json": {"prompt": "x", "lora": "ghost"}}, 404,
     "unknown adapter"),
    ("unknown-version", "POST", AI, {"json": {"prompt": "x", "lora": "upper@" + "0" * 64}},
     404, "unknown version"),
    ("workers-unknown-model", "POST", "/ai/run/llama", {"json": {"prompt": "x"}}, 404,
     "unknown model 'llama'"),
    ("bad-lora-name", "POST", AI, {"json": {"prompt": "x", "lora": "Bad Name"}}, 400,
     "invalid adapter name"),
    ("conflicting-adapters", "POST", CHAT, {"json": chat(model="upper", lora="rot13")}, 400,
     "lora names 'rot13'"),
    ("malformed-json", "POST", CHAT, raw(b'{"model": "demo",'), 400, "not valid JSON"),
    ("malformed-json-ai", "POST", AI, raw(b"{prompt: x}"), 400, "not valid JSON"),
    ("json-not-object", "POST", CHAT, raw(b"[1, 2]"), 400, "valid dictionary"),
    ("non-utf8", "POST", DONE, raw(b'{"model": "\xff\xfe"}'), 400, "UTF-8"),
    ("wrong-content-type", "POST", CHAT, raw(json.dumps(chat()).encode(), "text/plain"), 400,
     "Content-Type: application/json"),
    ("no-body", "POST", CHAT, {"headers": AUTH}, 400, "JSON body is required"),
    ("wrong-type", "POST", CHAT, {"json": chat(temperature="hot")}, 400, "temperature"),
    ("messages-not-list", "POST", CHAT, {"json": chat(messages="hi")}, 400, "messages"),
    ("missing-model", "POST", DONE, {"json": {"prompt": "x"}}, 400, "model: Field required"),
    ("temperature-high", "POST", CHAT, {"json": chat(temperature=3)}, 400, "temperature"),
    ("temperature-high-ai", "POST", AI, {"json": {"prompt": "x", "temperature": 5.5}}, 400,
     "less than or equal to 5"),
    ("top-p-high-ai", "POST", AI, {"json": {"prompt": "x", "top_p": 2.5}}, 400,
     "less than or equal to 2"),
    ("top-p-zero", "POST", DONE, {"json": {"model": MODEL_ID, "prompt": "x", "top_p": 0}}, 400,
     "top_p"),
    ("top-k-negative", "POST", AI, {"json": {"prompt": "x", "top_k": -1}}, 400, "top_k"),
    ("repetition-zero", "POST", AI, {"json": {"prompt": "x", "repetition_penalty": 0}}, 400,
     "repetition_penalty"),
    ("presence-high", "POST", CHAT, {"json": chat(presence_penalty=5)}, 400, "presence_penalty"),
    ("seed-too-low", "POST", CHAT, {"json": chat(seed=-(2**63) - 1)}, 400, "seed"),
    ("empty-messages", "POST", CHAT, {"json": chat(messages=[])}, 400,
     "messages must not be empty"),
    ("empty-messages-ai", "POST", AI, {"json": {"messages": []}}, 400,
     "messages must not be empty"),
    ("bad-role", "POST", CHAT, {"json": chat(messages=[{"role": "function", "content": "x"}])},
     400, "role must be 'system', 'developer', 'user', 'assistant' or 'tool', not 'function'"),
    ("image-part", "POST", CHAT, {"json": chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}])}, 400, "text"),
    ("long-prompt", "POST", DONE, {"json": {"model": MODEL_ID, "prompt": [5] * 200}}, 400,
     f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, the prompt has "
     "200 tokens"),
    ("long-text-prompt", "POST", AI, {"json": {"prompt": "word " * 300, "raw": True}}, 400,
     "This model's maximum context length is"),
    ("token-out-of-vocab", "POST", DONE, {"json": {"model": MODEL_ID, "prompt": [1, 99999]}},
     400, "token id 99999 is outside"),
    ("max-tokens-zero", "POST", CHAT, {"json": chat(max_tokens=0)}, 400,
     "max_tokens must be at least 1"),
    ("max-tokens-zero-ai", "POST", AI, {"json": {"prompt": "x", "max_tokens": 0}}, 400,
     "max_tokens must be at least 1"),
    ("max-tokens-float", "POST", DONE, {"json": {"model": MODEL_ID, "prompt": "x",
                                                  "max_tokens": 1.5}}, 400, "max_tokens"),
    ("queued-item-max-tokens", "POST", AI + "?queueRequest=true", {"json": {"requests": [
        {"prompt": "a"}, {"prompt": "b", "max_tokens": 0}]}}, 400,
     "requests.1.max_tokens must be at least 1"),
    ("queued-item-stream", "POST", AI + "?queueRequest=true", {"json": {"requests": [
        {"prompt": "a", "stream": True}]}}, 400,
     "requests.0.stream is not supported for a queued request"),
    ("queued-item-bad-lora", "POST", AI + "?queueRequest=true", {"json": {"requests": [
        {"prompt": "a"}, {"prompt": "b", "lora": "../x"}]}}, 400,
     "requests.1.lora: invalid adapter name '../x'"),
    ("empty-lora", "POST", AI, {"json": {"prompt": "x", "lora": ""}}, 400,
     "lora: invalid adapter name: a name is required"),
    ("empty-lora-openai", "POST", CHAT, {"json": chat(lora="")}, 400, "lora: invalid adapter"),
    ("n-many", "POST", CHAT, {"json": chat(n=17)}, 400, "less than or equal to 16"),
    ("n-zero", "POST", CHAT, {"json": chat(n=0)}, 400, "greater than or equal to 1"),
    ("choices-many", "POST", DONE, {"json": {"model": MODEL_ID, "prompt": ["a"] * 8, "n": 9}},
     400, "8 prompts x n=9 is 72 choices"),
    ("too-many-stops", "POST", CHAT, {"json": chat(stop=["a"] * 20)}, 400, "stop strings"),
    ("echo-on-chat", "POST", CHAT, {"json": chat(echo=True)}, 400,
     "echo is not served on /v1/chat/completions (send prompt_logprobs"),
    ("nothing-to-answer", "POST", DONE, {"json": {"model": MODEL_ID, "prompt": "x",
                                                  "max_tokens": 0}}, 400,
     "max_tokens must be at least 1 (0 is served with echo: true"),
    ("prompt-logprobs-many", "POST", DONE, {"json": {"model": MODEL_ID, "prompt": "x",
                                                     "prompt_logprobs": 21}}, 400,
     "prompt_logprobs: Input should be less than or equal to 20"),
    ("prompt-logprobs-stream", "POST", CHAT, {"json": chat(prompt_logprobs=1, stream=True)}, 400,
     "prompt_logprobs is not served with stream: true"),
    ("both-prompt-and-messages", "POST", AI, {"json": {"prompt": "x", "messages": USER}}, 400,
     "exactly one of prompt and messages"),
    ("neither", "POST", AI, {"json": {"max_tokens": 3}}, 400, "exactly one of prompt"),
    ("unknown-field-ai", "POST", AI, {"json": {"prompt": "x", "temprature": 1}}, 400,
     "temprature"),
    ("unknown-null-field-ai", "POST", AI, {"json": {"prompt": "x", "temprature": None}}, 400,
     "temprature"),
    ("gzip-body", "POST", CHAT, {"content": gzip.compress(json.dumps(chat()).encode()),
                                 "headers": {**AUTH, "content-type": "application/json",
                                             "content-encoding": "gzip"}}, 415,
     "Content-Encoding 'gzip' is not supported: send the body uncompressed"),
    ("huge-body", "POST", CHAT, raw(b" " * (3 << 19)), 413, "larger than the limit of 1 MiB"),
    ("huge-body-ai", "POST", AI, raw(b" " * (3 << 19)), 413, "larger than the limit"),
    ("huge-chunked-body", "POST", DONE, chunked(3 << 19), 413, "larger than the limit"),
    ("wrong-method", "GET", CHAT, {"headers": AUTH}, 405, "method GET is not allowed"),
    ("wrong-method-ai", "GET", AI, {"headers": AUTH}, 405, "not allowed"),
    ("no-route", "POST", "/v1/embeddings", {"json": {}}, 404, "no such route"),
    ("upload-not-multipart", "POST", "/v1/adapters", {"json": {"name": "x"}, "headers": AUTH},
     400, "name"),
    # JSON escapes lone surrogates, which no tokenizer encodes: raw bytes, as httpx cannot
    ("surrogate-prompt", "POST", DONE, raw(b'{"model": "demo", "prompt": "a\\ud800"}'), 400,
     "prompt: the text holds a lone surrogate (U+D800) at character 1"),
    ("surrogate-prompt-ai", "POST", AI, raw(b'{"prompt": "\\udfff"}'), 400, "lone surrogate"),
    ("surrogate-message", "POST", CHAT, raw(b'{"model": "demo", "messages": [{"role": "user", '
     b'"content": "\\ud83d"}]}'), 400, "lone surrogate"),
    ("surrogate-part", "POST", CHAT, raw(b'{"model": "demo", "messages": [{"role": "user", '
     b'"content": [{"type": "text", "text": "\\ud83d"}]}]}'), 400, "lone surrogate"),
    ("surrogate-stop", "POST", CHAT, raw(b'{"model": "demo", "messages": [{"role": "user", '
     b'"content": "x"}], "stop": ["\\udc00"]}'), 400, "lone surrogate"),
    ("surrogate-ai-message", "POST", AI, raw(b'{"messages": [{"role": "user", '
     b'"content": "\\ud800"}]}'), 400, "lone surrogate"),
    ("nested-body", "POST", DONE, raw(b'{"model": "demo", "prompt": ' + b"[" * 50_000
     + b"]" * 50_000 + b"}"), 400, "the JSON body nests too deeply"),
    ("nested-body-ai", "POST", AI, raw(b"[" * 50_000 + b"]" * 50_000), 400, "nests too deeply"),
    ("huge-model-name", "POST", CHAT, {"json": chat(model="m" * 500_000)}, 404,
     "the model 'mmmm"),
    ("huge-token-id", "POST", DONE, raw(b'{"model": "demo", "prompt": [' + b"9" * 4000
     + b"]}"), 400, "prompt: token id 9999"),
    ("huge-integer", "POST", DONE, raw(b'{"model": "demo", "prompt": "x", "seed": '
     + b"9" * 5000 + b"}"), 400, "a number with too many digits"),
]  # fmt: skip


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("errors")) as s:
        yield s


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "message"), [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)  # fmt: skip
def test_bad_input_is_a_json_error(served, method, path, kwargs, status, message):
    kwargs = {"headers": AUTH, **kwargs}
    r = httpx.request(method, served.url + path, timeout=30, **kwargs)
    assert r.status_code == status, r.text
    body = r.json()
    if path.startswith("/ai/"):
        assert set(body) == {"success", "errors", "messages", "result"} and body["success"] is False
        assert body["result"] is None and body["errors"][0]["code"] == status
        text = body["errors"][0]["message"]
    else:
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
        text = body["error"]["message"]
        if message == "not valid JSON":  # no field to name (not the character offset)
            assert body["error"]["param"] is None, r.text
    assert message in text, text
    assert "Traceback" not in r.text and len(r.content) < 2000  # no echo of a huge input


def test_the_table_is_wide():
    assert len(CASES) >= 20


def test_the_server_still_serves_after_all_that(served):
    r = httpx.post(served.url + CHAT, json=chat(temperature=0), headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("length", "stop")
