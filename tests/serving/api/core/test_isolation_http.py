"""Through the HTTP app: whatever sampling fields one caller sends, an innocent greedy request
with an adapter running beside it gets exactly its text alone, and the caller gets a 2xx or
a 4xx, never a 5xx."""

import math
import threading

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.serving.api.served import ACME, GLOBEX, MODEL_ID

INNOCENT = {"model": f"{MODEL_ID}:upper", "prompt": "def read(path):\n", "max_tokens": 10,
            "temperature": 0}  # fmt: skip


def edge_floats(low: float, high: float) -> st.SearchStrategy:
    """Floats over [low, high] weighted to 0, subnormals, the bounds and just past them."""
    edges = [low, high, 0.0, 5e-324, 1e-310, 1e-40, 9.99e-6, 1e-5, math.nextafter(high, 3)]
    return st.one_of(st.sampled_from(edges), st.floats(low, high, allow_subnormal=True))


FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "temperature": edge_floats(0.0, 2.0),
        "top_p": edge_floats(0.0, 1.0),
        "top_k": st.one_of(st.sampled_from([0, 1, 512, 10**30, -1]), st.integers(0, 600)),
        "repetition_penalty": edge_floats(0.0, 2.0),
        "frequency_penalty": edge_floats(-2.0, 2.0),
        "presence_penalty": edge_floats(-2.0, 2.0),
        "seed": st.one_of(st.sampled_from([0, 2**63 - 1, 2**63, -1]), st.integers(0, 2**64)),
        "max_tokens": st.sampled_from([0, 1, 4, 10**12]),
        "logprobs": st.sampled_from([None, 0, 5, 20, 21]),
    },
)


@pytest.fixture(scope="module")
def alone(served):
    return complete(served, INNOCENT, ACME).json()["choices"][0]["text"]


def complete(served, body, key):
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(f"{served.url}/v1/completions", json=body, headers=headers, timeout=60)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(fields=FIELDS, route=st.sampled_from(["completions", "ai-run"]))
@example(fields={"temperature": 1e-40}, route="completions")  # each once failed every request
@example(fields={"temperature": 1e-46}, route="ai-run")
@example(fields={"temperature": 0.5, "repetition_penalty": 1e-40}, route="completions")
# top logprobs of ids past the tokenizer's vocabulary (the model has more embedding rows)
@example(fields={"temperature": 0.0, "logprobs": 5}, route="completions")
def test_a_drawn_request_never_harms_its_neighbour_nor_gets_a_5xx(served, alone, fields, route):
    innocent = {}
    thread = threading.Thread(target=lambda: innocent.update(r=complete(served, INNOCENT, ACME)))
    thread.start()
    headers = {"authorization": f"Bearer {GLOBEX}"}
    if route == "completions":
        body = {"model": MODEL_ID, "prompt": "x\n", **fields}
        drawn = httpx.post(f"{served.url}/v1/completions", json=body, headers=headers, timeout=60)
    else:
        body = {"prompt": "x\n", **{k: v for k, v in fields.items() if k != "logprobs"}}
        drawn = httpx.post(
            f"{served.url}/ai/run/{MODEL_ID}", json=body, headers=headers, timeout=60
        )
    thread.join()
    assert drawn.status_code < 500, drawn.text
    if drawn.status_code == 200 and route == "completions":
        assert drawn.json()["choices"][0]["finish_reason"] in ("length", "stop")
    assert innocent["r"].status_code == 200
    assert innocent["r"].json()["choices"][0]["text"] == alone
