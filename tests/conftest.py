"""Test-wide setup: Triton kernels run in the interpreter where there is no GPU; models check
every layer's attention arguments."""

import os
import sys

import pytest
import torch

# Every layer of a model checks its attention arguments as well (a step is otherwise checked
# once, not per layer): a bad step fails at the layer that gets it.
os.environ.setdefault("LORASERVE_CHECKS", "1")

if not torch.cuda.is_available():
    # Must be set before any @triton.jit function is defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_EXIT_STATUS = 0


def pytest_sessionfinish(session, exitstatus):
    global _EXIT_STATUS
    _EXIT_STATUS = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    # The session's result is written and final here. What would follow is the interpreter's
    # teardown with the native threads the libraries leave behind (torch's, Ray's, the grammar
    # compiler's), which has crashed a whole passing run after its summary (a segfault, exit
    # 139). The process ends now with the session's own status instead.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS)
