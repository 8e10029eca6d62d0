"""Tool calling for a model that spells calls as Mistral does: `[TOOL_CALLS]` (a special
token, which the constraint must emit and the output keep) and one list of calls. Oracles:
the function's schema for each call's arguments; the token ids the engine generated (the
marker's own id first); the model's template, which refuses a call id that is not 9
characters, rendering the answer's calls back."""

import json

import jsonschema
import openai
import pytest

from serving.model.tool_formats import MISTRAL, detect
from tests.serving.api.openai.test_tools import ADD, ASK
from tests.serving.api.openai.tool_world import MARKER, mistral_world
from tests.serving.api.served import ACME, serve

# one small function: the tiny tokenizer spells most text a character a token
SCHEMAS = {"add": ADD}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": ADD}}]
FIXED = {"temperature": 0, "max_tokens": 200}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    world = mistral_world(tmp_path_factory.mktemp("mistral-world"))
    with serve(world, tmp_path_factory.mktemp("mistral"), max_model_len=512) as s:
        yield s


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=ACME, max_retries=0)


def test_the_template_names_the_family(served):
    assert detect(served.world.tokenizer.chat_template) is MISTRAL
    marker = served.world.tokenizer.encode(MARKER, add_special_tokens=False)
    assert len(marker) == 1 and marker[0] in served.world.tokenizer.special_token_ids()


@pytest.mark.parametrize("parallel", [False, True])
def test_required_calls_open_with_the_marker_token(client, served, parallel):
    r = client.chat.completions.create(model="demo:upper", messages=ASK, tools=TOOLS,
                                       tool_choice="required", parallel_tool_calls=parallel,
                                       logprobs=True, **FIXED)  # fmt: skip
    choice = r.choices[0]
    if parallel and choice.finish_reason == "length":  # a list of calls cut: text, no calls
        assert choice.message.tool_calls is None
        return
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1 or parallel
    for call in choice.message.tool_calls:
        assert len(call.id) == 9 and call.id.isalnum()
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    # the first token generated is the marker itself, not its characters one by one
    marker = served.world.tokenizer.encode(MARKER, add_special_tokens=False)[0]
    first = choice.logprobs.content[0]
    assert bytes(first.bytes) == served.world.tokenizer.token_bytes(marker)
    assert first.token == MARKER or first.bytes == list(MARKER.encode())


def test_calls_go_back_into_the_history(client):
    first = client.chat.completions.create(
        model="demo", messages=ASK, tools=TOOLS, **FIXED,
        tool_choice={"type": "function", "function": {"name": "add"}},
    )  # fmt: skip
    message = first.choices[0].message
    history = [*ASK, message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "3"}]  # fmt: skip
    again = client.chat.completions.create(model="demo", messages=history, tools=TOOLS,
                                           max_tokens=2)  # fmt: skip
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_a_stream_reads_the_list_as_the_whole_answer_does(client):
    kwargs = dict(model="demo:rot13", messages=ASK, tools=TOOLS, tool_choice="required",
                  parallel_tool_calls=False, **FIXED)  # fmt: skip
    [want] = client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    deltas = [d for c in client.chat.completions.create(stream=True, **kwargs)
              for ch in c.choices for d in ch.delta.tool_calls or []]  # fmt: skip
    assert deltas[0].function.name == want.function.name and len(deltas[0].id) == 9
    assert "".join(d.function.arguments for d in deltas) == want.function.arguments
