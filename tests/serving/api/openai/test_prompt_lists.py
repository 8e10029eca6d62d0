"""Several choices in one answer: /v1/completions with a list of prompts (text or token ids),
as the `openai` client and lm-eval-harness send them, and n choices per prompt on both OpenAI
routes. Each choice is in order and equals its prompt sent alone (greedy, or with seed + j),
streamed or not; usage is their sum. A fault in one, or a client that leaves, ends them
all; a batch line asks for one choice."""

import asyncio
import json
from collections import Counter

import pytest
from fastapi.testclient import TestClient

from serving.api import create_app
from serving.api.app import LINE_BODIES
from serving.api.batch.input import parse_input
from serving.api.core.choices import start_all
from serving.api.core.errors import ApiError
from serving.api.core.generation import Generation
from serving.engine.request import RequestOutput
from tests.serving.api.core.test_sse import AUTH, Endless, stalled_client
from tests.serving.api.core.test_stream_faults import DiesMidStream
from tests.serving.api.served import MODEL_ID, stub_settings

TEXTS = ["def add(a, b):", "hello there", "the quick brown fox"]
TOKENS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


def references(served, prompts, max_tokens=5):
    ids = [served.text_ids(p) if isinstance(p, str) else p for p in prompts]
    return ids, [served.reference(one, "upper", max_tokens) for one in ids]


@pytest.mark.parametrize("prompts", [TEXTS, TOKENS], ids=["texts", "token-lists"])
def test_each_prompt_is_a_choice_equal_to_it_sent_alone(served, client, prompts):
    ids, refs = references(served, prompts)
    answer = client.completions.create(
        model="upper", prompt=prompts, max_tokens=5, temperature=0, logprobs=1
    )
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert [c.text for c in answer.choices] == [text for _, text in refs]
    assert [len(c.logprobs.tokens) for c in answer.choices] == [len(t) for t, _ in refs]
    assert all(c.logprobs.text_offset[0] == 0 for c in answer.choices)
    assert answer.usage.prompt_tokens == sum(map(len, ids))
    assert answer.usage.completion_tokens == sum(len(t) for t, _ in refs)


def test_a_streamed_list_interleaves_choices_each_whole_and_ended_once(served, client):
    ids, refs = references(served, TEXTS)
    chunks = list(client.completions.create(
        model="upper", prompt=TEXTS, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True},
    ))  # fmt: skip
    texts, ends = ["", "", ""], [0, 0, 0]
    for chunk in chunks[:-1]:
        [choice] = chunk.choices
        texts[choice.index] += choice.text
        ends[choice.index] += choice.finish_reason is not None
    assert texts == [text for _, text in refs] and ends == [1, 1, 1]
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == sum(map(len, ids))
    assert chunks[-1].usage.completion_tokens == sum(len(t) for t, _ in refs)


def test_a_client_that_stops_reading_frees_every_prompts_request(world, tmp_path):
    generator = Endless()
    app = create_app(generator, stub_settings(world, tmp_path, send_timeout_s=0.2))
    body = {"model": MODEL_ID, "prompt": ["a", "b", "c"], "stream": True}
    asyncio.run(stalled_client(app, generator, "/v1/completions", json.dumps(body).encode(),
                               closed=3))  # fmt: skip
    assert len(generator.closed) == 3


@pytest.mark.parametrize("stream", [False, True])
def test_a_fault_in_one_prompt_ends_the_answer_and_every_request(world, tmp_path, stream):
    app = create_app(DiesMidStream(), stub_settings(world, tmp_path))
    body = {"model": MODEL_ID, "prompt": ["a", "b"], "stream": stream}
    r = TestClient(app, raise_server_exceptions=False).post(
        "/v1/completions", json=body, headers=AUTH
    )
    if stream:
        events = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        assert events[-1] == "[DONE]"
        assert "replica" in json.loads(events[-2])["error"]["message"]
    else:
        assert r.status_code == 500 and "retry" in r.json()["error"]["message"]


def test_a_batch_line_holds_one_prompt():
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions",
            "body": {"model": MODEL_ID, "prompt": ["a", "b"]}}  # fmt: skip
    with pytest.raises(ApiError, match="line 1: body: a line asks for one choice"):
        parse_input(json.dumps(line).encode(), LINE_BODIES)
    one = {**line, "body": {"model": MODEL_ID, "prompt": ["a"]}}
    assert parse_input(json.dumps(one).encode(), LINE_BODIES)[0].body["prompt"] == ["a"]


class _Started(Generation):
    """A generation that only notes being closed."""

    def __init__(self):  # no engine behind it
        self.closed, self._bill, self._held = False, True, False

    async def aclose(self, *, held_too=False):
        self.closed = True


def test_starts_cancelled_midway_close_the_generations_already_started():
    """The client leaves while one prompt has started and another still waits for its
    first token: the started one is closed (aborted and metered), not left running."""

    async def scenario():
        first = _Started()

        async def quick():
            return first

        async def slow():
            await asyncio.Event().wait()

        task = asyncio.ensure_future(start_all([quick(), slow()]))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return first

    assert asyncio.run(scenario()).closed


def test_a_start_that_fails_closes_the_others_and_is_raised():
    async def scenario():
        ok = _Started()

        async def good():
            return ok

        async def bad():
            raise ApiError(429, "busy")

        with pytest.raises(ApiError, match="busy"):
            await start_all([good(), bad()])
        return ok

    ok = asyncio.run(scenario())
    assert ok.closed and not ok._bill  # the client got the 429, none of this choice


def test_n_choices_of_a_chat_differ_by_seed_and_repeat(served, client):
    """Choice j samples with seed + j: each equals the single-choice answer of that seed,
    so the choices differ yet the request repeats; greedy choices are all the greedy one."""
    chat = [{"role": "user", "content": "hello there"}]
    kwargs = dict(model="upper", messages=chat, max_tokens=6, temperature=1.0)
    many = client.chat.completions.create(n=3, seed=11, **kwargs)
    alone = [client.chat.completions.create(seed=11 + j, **kwargs) for j in range(3)]
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert [c.message.content for c in many.choices] == [
        a.choices[0].message.content for a in alone
    ]
    assert many.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert many.usage.prompt_tokens == alone[0].usage.prompt_tokens  # the prompt, once
    _, greedy = served.reference(served.chat_ids(chat), "upper", 6)
    flat = client.chat.completions.create(n=2, **{**kwargs, "temperature": 0})
    assert [c.message.content for c in flat.choices] == [greedy, greedy]


def test_a_negative_seed_is_a_seed_too(client):
    """Any 64-bit seed, as vLLM takes: -7 repeats, and choice j of n is seed -7 + j."""
    kwargs = dict(model=MODEL_ID, prompt="x\n", max_tokens=8, temperature=1.0)
    first, again = (client.completions.create(seed=-7, **kwargs) for _ in range(2))
    assert first.choices[0].text == again.choices[0].text
    pair = client.completions.create(seed=-8, n=2, **kwargs)
    assert pair.choices[1].text == first.choices[0].text


def test_completion_choices_are_prompt_major_and_stream_by_index(served, client):
    """Prompt p's j-th choice is index p * n + j, streamed or not; each stream index opens,
    carries its text and ends once."""
    refs = [served.reference(served.text_ids(t), None, 4)[1] for t in TEXTS[:2]]
    kwargs = dict(model=MODEL_ID, prompt=TEXTS[:2], n=2, max_tokens=4, temperature=0)
    answer = client.completions.create(**kwargs)
    assert [c.text for c in answer.choices] == [refs[0], refs[0], refs[1], refs[1]]
    texts, ends = [""] * 4, [0] * 4
    for chunk in client.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            ends[choice.index] += choice.finish_reason is not None
    assert texts == [c.text for c in answer.choices] and ends == [1] * 4
    # Each prompt's tokens once, however many choices it has; every choice's completion.
    prompt_tokens = sum(len(served.text_ids(t)) for t in TEXTS[:2])
    assert answer.usage.prompt_tokens == prompt_tokens
    assert answer.usage.completion_tokens == 4 * 4
    last = list(client.completions.create(stream_options={"include_usage": True}, stream=True,
                                          **kwargs))[-1]  # fmt: skip
    assert last.usage.prompt_tokens == prompt_tokens and last.usage.completion_tokens == 16
    chat = [{"role": "user", "content": "hi"}]
    roles = Counter()
    for chunk in client.chat.completions.create(
        model=MODEL_ID, messages=chat, n=3, max_tokens=2, stream=True
    ):
        for choice in chunk.choices:
            roles[choice.index] += choice.delta.role == "assistant"
    assert roles == {0: 1, 1: 1, 2: 1}


class Stub:
    """A generator that the app sees as always ready; subclasses answer the requests."""

    async def figures(self):
        return []

    async def ready(self):
        return True


class SecondFails(Stub):
    """Each request answers a token; the second choice then fails, the others finish."""

    async def generate(self, request, *, session=None):
        yield RequestOutput(request.request_id, (5,), "a", prompt_tokens=2, completion_tokens=1)
        if request.request_id.endswith("-1"):
            await asyncio.sleep(0.05)  # the others have finished by then
            raise RuntimeError("replica lost")
        yield RequestOutput(request.request_id, (6,), "b", True, "length", 2, 2)


def test_an_answer_that_fails_bills_none_of_its_choices(world, tmp_path):
    app = create_app(SecondFails(), stub_settings(world, tmp_path))
    client = TestClient(app, raise_server_exceptions=False)
    body = {"model": MODEL_ID, "prompt": ["a", "b", "c"], "max_tokens": 2}
    r = client.post("/v1/completions", json=body, headers=AUTH)
    assert r.status_code == 500
    usage = client.get("/v1/usage", headers=AUTH).json()["data"]
    assert sum(row["interactive"]["requests"] for row in usage) == 0
    one = client.post("/v1/completions", json={**body, "prompt": "a"}, headers=AUTH)
    assert one.status_code == 200  # a whole answer is billed, as before
    usage = client.get("/v1/usage", headers=AUTH).json()["data"]
    assert sum(row["interactive"]["requests"] for row in usage) == 1


class FirstFails(Stub):
    """Two choices stream a token each; the first then fails while the second still runs."""

    async def generate(self, request, *, session=None):
        yield RequestOutput(request.request_id, (5,), "a", prompt_tokens=3, completion_tokens=1)
        if request.request_id.endswith("-0"):
            await asyncio.sleep(0.05)
            raise RuntimeError("replica lost")
        await asyncio.sleep(5)  # still running when the stream ends: closed as an abort
        yield RequestOutput(request.request_id, (6,), "b", True, "length", 3, 2)


def test_when_a_streams_first_choice_fails_another_bills_the_prompt(world, tmp_path):
    """A stream of n=2 whose first choice fails mid-way: the second, closed with the stream,
    is billed as an abort, and it carries the prompt, which is billed once."""
    app = create_app(FirstFails(), stub_settings(world, tmp_path))
    client = TestClient(app, raise_server_exceptions=False)
    body = {"model": MODEL_ID, "prompt": "a", "max_tokens": 2, "n": 2, "stream": True}
    r = client.post("/v1/completions", json=body, headers=AUTH)
    events = [line.removeprefix("data: ") for line in r.text.splitlines() if line]
    assert r.status_code == 200 and "replica serving this request failed" in events[-2]
    assert events[-1] == "[DONE]"
    usage = client.get("/v1/usage", headers=AUTH).json()["data"]
    billed = [row["interactive"] for row in usage]
    assert sum(b["requests"] for b in billed) == 1  # the failed choice is not metered
    assert sum(b["prompt_tokens"] for b in billed) == 3
    assert sum(b["completion_tokens"] for b in billed) == 1
