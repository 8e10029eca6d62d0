"""Property-based requests from /openapi.json against the generation and model routes: whatever
schemathesis sends, the server never answers 5xx."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from tests.serving.api.served import ACME, MODEL_ID, serve

ROUTES = r"^/(v1/chat/completions|v1/completions|v1/responses|v1/models|ai/run/\{model\})$"
OPERATIONS = ["POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses",
              "GET /v1/models", "POST /ai/run/{model}"]  # fmt: skip


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    # a short context keeps every generated request quick
    with serve(world, tmp_path_factory.mktemp("schemathesis"), max_model_len=24) as s:
        yield s


@pytest.fixture(scope="module")
def operations(served):
    schema = schemathesis.openapi.from_url(f"{served.url}/openapi.json")
    found = {}
    for result in schema.include(path_regex=ROUTES).get_all_operations():
        operation = result.ok()
        found[f"{operation.method.upper()} {operation.path}"] = operation
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", OPERATIONS)
def test_no_server_errors(operations, name):
    # Driven by hypothesis directly: schemathesis' pytest plugin does not load on this pytest.
    # Most cases get a model that exists, so requests get past the model lookup and reach
    # tokenization, sampling and the engine rather than all ending in a 404.
    models = st.sampled_from([None, MODEL_ID, "upper", f"{MODEL_ID}:rot13"])

    @given(case=operations[name].as_strategy(), model=models)
    @settings(
        max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def check(case, model):
        if model is not None and isinstance(case.body, dict):
            case.body["model"] = model
        if model is not None and "model" in (case.path_parameters or {}):
            case.path_parameters["model"] = MODEL_ID
        case.call_and_validate(
            headers={"Authorization": f"Bearer {ACME}"}, checks=[not_a_server_error], timeout=60
        )

    check()
