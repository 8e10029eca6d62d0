"""The Batch deployment's handle answers every call the routes make of a batch client."""

import inspect

from serving.api.batch_client import BatchClient, LocalBatch
from serving.deploy.batch import HandleBatch


def _calls(cls) -> set[str]:
    return {name for name, value in vars(cls).items() if callable(value) and name[0] != "_"}


def test_the_handle_and_the_local_client_have_every_call_of_the_protocol():
    calls = _calls(BatchClient)
    assert calls <= _calls(HandleBatch) and calls <= _calls(LocalBatch)
    # submit has its own remote method; the rest go through BatchService.call's allow-list
    assert calls - {"submit"} == set(HandleBatch.FORWARDED)
    for name in calls:
        assert inspect.iscoroutinefunction(getattr(HandleBatch, name)), name
        handle, protocol = (inspect.signature(getattr(c, name)) for c in (HandleBatch, BatchClient))
        if name != "submit":  # **job there: the store checks the keywords
            assert list(handle.parameters) == list(protocol.parameters), name
