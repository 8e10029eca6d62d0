"""One tiny world (model, tokenizer with a chat template, PEFT adapters) for every API test;
a server of it per test module (`served`), and the `openai` client of that server."""

import openai
import pytest

from tests.serving.api.served import ACME, chat_world, serve


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    return chat_world(tmp_path_factory.mktemp("api-world"))


@pytest.fixture(scope="module")
def served(world, tmp_path_factory, request):
    """The world served over HTTP, one server per module that asks (a module may define its
    own `served` with other settings)."""
    with serve(world, tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])) as s:
        yield s


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=ACME, max_retries=0)


@pytest.fixture(scope="module")
def browser():
    """A headless chromium (tests/serving/api/browser.py) for a module's dashboard tests."""
    from tests.serving.api.browser import chromium

    with chromium() as b:
        yield b
