"""One tiny world (model, tokenizer with a chat template, PEFT adapters) for every API test."""

import pytest

from tests.serving.api.served import chat_world


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    return chat_world(tmp_path_factory.mktemp("api-world"))
