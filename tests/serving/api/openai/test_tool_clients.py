"""Tool calling through client libraries nobody here wrote: instructor in its default TOOLS
mode, and langchain-openai's bind_tools and with_structured_output(function_calling). Each
sends its own tools and tool_choice; the answer must come back as their parsed objects, and
those must validate against the schema pydantic wrote for them."""

from typing import Literal

import instructor
import jsonschema
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict, Field

from tests.serving.api.openai.tool_world import tool_world
from tests.serving.api.served import ACME, serve

ASK = [{"role": "user", "content": "What is the weather in Oslo this week?"}]


class Weather(BaseModel):
    """The forecast asked for."""

    model_config = ConfigDict(extra="forbid")

    city: Literal["Paris", "Oslo"]
    days: int = Field(ge=1, le=7)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    world = tool_world(tmp_path_factory.mktemp("clients-world"))
    with serve(world, tmp_path_factory.mktemp("clients"), max_model_len=512) as s:
        yield s


@pytest.mark.parametrize("model", ["demo", "demo:rot13"])
def test_instructor_tools_mode(served, model):
    client = instructor.from_openai(
        openai.OpenAI(base_url=f"{served.url}/v1", api_key=ACME, max_retries=0),
        mode=instructor.Mode.TOOLS,
    )
    got = client.chat.completions.create(model=model, messages=ASK, response_model=Weather,
                                         max_retries=0, temperature=0, max_tokens=160)  # fmt: skip
    assert isinstance(got, Weather)
    jsonschema.validate(got.model_dump(), Weather.model_json_schema())


def chat(served, model="demo:upper") -> ChatOpenAI:
    return ChatOpenAI(base_url=f"{served.url}/v1", api_key=ACME, model=model, temperature=0,
                      max_tokens=160, max_retries=0)  # fmt: skip


def test_langchain_bind_tools(served):
    llm = chat(served).bind_tools([Weather], tool_choice="Weather")
    message = llm.invoke(ASK[0]["content"])
    [call] = message.tool_calls
    assert call["name"] == "Weather" and call["id"].startswith("call_")
    jsonschema.validate(call["args"], Weather.model_json_schema())


def test_langchain_structured_output_by_function_calling(served):
    got = (
        chat(served, "demo")
        .with_structured_output(Weather, method="function_calling")
        .invoke(ASK[0]["content"])
    )
    assert isinstance(got, Weather)
