"""/healthz, /readyz (the readiness flag and the generator both count) and /openapi.json;
no /docs or /redoc page, which would load scripts from a CDN."""

import httpx
import pytest

from tests.serving.api.served import serve


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    with serve(world, tmp_path_factory.mktemp("ops")) as s:
        yield s


def test_healthz(served):
    r = httpx.get(served.url + "/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_probes_answer_head_as_get(served):
    assert httpx.head(served.url + "/healthz").status_code == 200
    assert httpx.head(served.url + "/readyz").status_code == 200


def test_readyz_follows_the_flag(served):
    assert httpx.get(served.url + "/readyz").json() == {"status": "ready"}
    served.settings.ready.clear()
    try:
        r = httpx.get(served.url + "/readyz")
        assert r.status_code == 503 and r.json() == {"status": "starting"}
        assert httpx.head(served.url + "/readyz").status_code == 503
    finally:
        served.settings.ready.set()
    assert httpx.get(served.url + "/readyz").status_code == 200


def test_readyz_follows_the_generator(world, tmp_path):
    with serve(world, tmp_path) as s:
        s.generator.close()
        assert httpx.get(s.url + "/readyz").status_code == 503


def test_openapi_documents_every_route(served):
    spec = httpx.get(served.url + "/openapi.json").json()
    assert {
        "/ai/run/{model}",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/v1/models/{model}",
        "/v1/adapters",
        "/v1/adapters/{name}",
        "/metrics",
        "/healthz",
        "/readyz",
    } <= set(spec["paths"])
    assert "HTTPBearer" in spec["components"]["securitySchemes"]


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/docs/oauth2-redirect"])
def test_no_docs_page_loads_scripts_from_elsewhere(served, path):
    r = httpx.get(served.url + path)
    assert r.status_code == 404 and "cdn" not in r.text.lower()
