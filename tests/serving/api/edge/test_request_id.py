"""Every answer carries x-request-id, as OpenAI's API does, and the `openai` client reads it:
a fresh one per request, a client's own echoed back, a malformed one replaced; refusals by
the gate and errors carry it too."""

import httpx
import openai

from tests.serving.api.served import ACME, MODEL_ID


def test_answers_and_errors_name_their_request(served, client):
    raw = client.completions.with_raw_response.create(model=MODEL_ID, prompt="hi", max_tokens=1)
    first = raw.headers["x-request-id"]
    assert first.startswith("req_") and raw.request_id == first
    again = client.completions.with_raw_response.create(model=MODEL_ID, prompt="hi", max_tokens=1)
    assert again.request_id != first
    unknown = openai.OpenAI(base_url=f"{served.url}/v1", api_key="wrong", max_retries=0)
    try:
        unknown.models.list()
    except openai.AuthenticationError as exc:  # refused by the gate, before any route
        assert exc.request_id.startswith("req_")
    else:
        raise AssertionError("a wrong key was let in")


def test_a_clients_own_id_comes_back_and_a_malformed_one_is_replaced(served):
    auth = {"Authorization": f"Bearer {ACME}"}
    mine = httpx.get(f"{served.url}/v1/models", headers={**auth, "x-request-id": "trace-42.a"})
    assert mine.headers["x-request-id"] == "trace-42.a"
    for sent in ("a b\tc", "a" * 20_000, "a" * 129):
        bad = httpx.get(f"{served.url}/v1/models", headers={**auth, "x-request-id": sent})
        assert bad.headers["x-request-id"].startswith("req_")
