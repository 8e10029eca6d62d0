"""/metrics' loraserve_state_entries and loraserve_state_capacity: what a replica keeps across
requests, each beside its bound, moving with real use (a cached prefix, a schema checked and
compiled, a wrong key, a request ended)."""

import httpx
import pytest

from kernels import packed_shapes
from kernels.cpu_gemm import ROW_BUCKETS
from serving.api.core.recent import Recent
from serving.api.core.schema_rules import CHECKED_SCHEMAS
from serving.api.edge.key_guesses import MAX_CLIENTS
from serving.engine.grammar.compiler import CACHE_SIZE
from tests.serving.api.core.test_metrics import scrape
from tests.serving.api.served import ACME, MODEL_ID, serve
from tests.serving.engine.world import FIELDS

AUTH = {"Authorization": f"Bearer {ACME}"}
NUM_BLOCKS = 256  # tests.serving.api.served's engine


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("state")) as s:
        yield s


def states(served) -> dict[str, tuple[float, float | None]]:
    """state -> (entries, capacity or None) of the one replica, the local engine."""
    samples = scrape(served)

    def family(name: str) -> dict[str, float]:
        rows = {dict(labels)["state"]: (dict(labels)["replica"], v)
                for (n, labels), v in samples.items() if n == name}  # fmt: skip
        assert {replica for replica, _ in rows.values()} <= {"local"}
        return {state: v for state, (_, v) in rows.items()}

    capacity = family("loraserve_state_capacity")
    return {
        state: (n, capacity.get(state)) for state, n in family("loraserve_state_entries").items()
    }


def complete(served, prompt: str, **fields) -> httpx.Response:
    body = {"model": MODEL_ID, "prompt": prompt, "max_tokens": 2, "temperature": 0, **fields}
    return httpx.post(served.url + "/v1/completions", json=body, headers=AUTH, timeout=60)


def test_each_state_is_shown_beside_its_bound(served):
    got = states(served)
    f = FIELDS
    head_dim = f["hidden_size"] // f["num_attention_heads"]
    q, kv = f["num_attention_heads"] * head_dim, f["num_key_value_heads"] * head_dim
    hidden, inter = f["hidden_size"], f["intermediate_size"]
    # (out, in) of qkv, o, gate_up, down and the LM head, none with a bias
    weights = {(q + 2 * kv, hidden), (hidden, q), (2 * inter, hidden), (hidden, inter),
               (f["vocab_size"], hidden)}  # fmt: skip
    assert {name: most for name, (_, most) in got.items()} == {
        "prefix_cache_blocks": NUM_BLOCKS,
        "grammar_compiles": CACHE_SIZE,
        "adapters_short_of_room": None,
        "cpu_gemm_primitives": len(ROW_BUCKETS) * len(weights),
        "recent_buckets": Recent().capacity,
        "key_guess_clients": MAX_CLIENTS,
        "schema_checks": CHECKED_SCHEMAS,
        "tenant_locks": None,
    }
    assert got["cpu_gemm_primitives"][0] == packed_shapes()  # the process's, every engine's
    assert got["tenant_locks"][0] == 0 and got["adapters_short_of_room"][0] == 0


def test_the_entries_move_with_use(served):
    before = states(served)
    prompt = " ".join(f"word{i}" for i in range(12))  # some whole blocks of 4 tokens
    assert complete(served, prompt).status_code == 200
    after = states(served)
    assert after["prefix_cache_blocks"][0] > before["prefix_cache_blocks"][0]
    assert after["recent_buckets"][0] >= 1
    schema = {"type": "object", "properties": {"state_gauge": {"type": "integer"}}}
    body = {"model": MODEL_ID, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "a number"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "n", "schema": schema}}}  # fmt: skip
    r = httpx.post(served.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    checked = states(served)
    assert checked["schema_checks"][0] == min(after["schema_checks"][0] + 1, CHECKED_SCHEMAS)
    assert checked["grammar_compiles"][0] == after["grammar_compiles"][0] + 1
    assert checked["key_guess_clients"][0] == 0
    wrong = httpx.get(served.url + "/v1/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert states(served)["key_guess_clients"][0] == 1  # this client's window
