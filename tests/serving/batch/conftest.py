"""The API tests' tiny world, for the batch tests too; a batch store on a file of its own."""

import pytest

from serving.batch.store import BatchStore
from tests.serving.api.served import chat_world


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    return chat_world(tmp_path_factory.mktemp("batch-world"))


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'batch.db'}"


@pytest.fixture
def store(url):
    s = BatchStore(url)
    yield s
    s.close()
