"""wrangler, Cloudflare's CLI from npm, against `loraserve serve` with CLOUDFLARE_API_BASE_URL
pointed at it and one of our keys as its token: `wrangler ai finetune create` uploads the
demo kit's adapter, `wrangler ai finetune list` shows it, and it answers as `lora`; `wrangler ai models` lists the
served model.

wrangler finds its account from GET /memberships (no CLOUDFLARE_ACCOUNT_ID is set). .ci/run
installs it (npm, `wrangler@4`); elsewhere npx fetches it on first use."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import httpx
import pytest
import yaml

from tests.serving.deploy.demo_served import DEMO, launched, write_demo_config
from tests.serving.deploy.served import free_port, wait_ready

NPX = shutil.which("npx")
KEY = "wrangler-test-key-0123"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(NPX is None, reason="npx is not installed")]


def wrangler(url: str, home, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HOME": str(home),
        "CLOUDFLARE_API_BASE_URL": f"{url}/client/v4",
        "CLOUDFLARE_API_TOKEN": KEY,
        "WRANGLER_SEND_METRICS": "false",
        "CI": "true",  # never prompt
    }
    env.pop("CLOUDFLARE_ACCOUNT_ID", None)
    return subprocess.run([NPX, "--yes", "wrangler@4", *args], env=env, cwd=home,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_wrangler_creates_lists_and_the_finetune_answers(tmp_path):
    port = free_port()
    config_path = write_demo_config(tmp_path, port)
    config = yaml.safe_load(config_path.read_text())
    (tmp_path / "keys").write_text(f"{KEY} acme user\n")
    (tmp_path / "keys").chmod(0o600)
    config["server"]["api_keys_file"] = str(tmp_path / "keys")
    config_path.write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{port}"
    home = tmp_path / "wrangler-home"
    home.mkdir()
    with launched(tmp_path, config_path) as (_proc, log):
        wait_ready(url)
        made = wrangler(url, home, "ai", "finetune", "create", "demo", "wr-upper",
                        str(DEMO / "adapters" / "upper"))  # fmt: skip
        out = made.stdout + made.stderr
        assert made.returncode == 0 and "is ready to use" in out, out + log.read_text()[-2000:]
        listed = wrangler(url, home, "ai", "finetune", "list", "--json")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        rows = json.loads(listed.stdout[listed.stdout.index("[") :])
        [row] = [r for r in rows if r["name"] == "wr-upper"]
        models = wrangler(url, home, "ai", "models", "--json")
        assert models.returncode == 0, models.stdout + models.stderr
        catalogue = json.loads(models.stdout[models.stdout.index("[") :])
        assert [m["name"] for m in catalogue] == ["demo"]
        auth = {"Authorization": f"Bearer {KEY}"}
        answers = []
        for lora in (row["id"], "wr-upper", "upper"):  # its id, its name, the preloaded one
            body = {"prompt": "def read_lines(path):\n", "max_tokens": 8, "temperature": 0,
                    "lora": lora}  # fmt: skip
            r = httpx.post(f"{url}/client/v4/accounts/acme/ai/run/demo", json=body,
                           headers=auth, timeout=60)  # fmt: skip
            assert r.status_code == 200, r.text
            answers.append(r.json()["result"]["response"])
        assert answers[0] == answers[1] == answers[2]  # the same adapter's bytes
