"""The API tests' tiny world, for the batch tests too."""

import pytest

from tests.serving.api.served import chat_world


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    return chat_world(tmp_path_factory.mktemp("batch-world"))
