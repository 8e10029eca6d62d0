"""The server bench/fleet.py drives, and what it is fed and asked: loraserve's app and engine
in one process (bench/peers/local_server.py) on the demo kit with the DEFAULT lora section,
distinct PEFT adapters of the demo base model uploaded over HTTP, and its slab's figures
read back from /v1/stats (and its load and eviction counters from /metrics).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import httpx
import torch
import yaml
from safetensors.torch import save

from adapters.format.sources import CONFIG, WEIGHTS
from bench.servers import DEMO, Server, free_port, loraserve_config

TARGETS = ("q_proj", "v_proj")
PAGE_FIGURES = ("pages", "pages_used")  # in /v1/stats' per-replica `slab`, where it has one
COUNTERS = {
    "loads": "loraserve_adapter_loads_total",
    "evictions": "loraserve_adapter_evictions_total",
}


def start_server(tmp: Path, max_num_seqs: int) -> Server:
    """bench/serve.py's loraserve-local (demo kit, no speculation), but every lora key but
    the registry left at its default: the slab and host tier are what a user gets unasked."""
    path = loraserve_config(tmp, max_num_seqs)
    cfg = yaml.safe_load(path.read_text())
    cfg["lora"] = {"registry": cfg["lora"]["registry"]}  # no preloads: the slab is ours alone
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    from serving.config import load_config

    load_config(path)
    port = free_port()
    cmd = [sys.executable, "-m", "bench.peers.local_server", "--config", str(path),
           "--port", str(port)]  # fmt: skip
    return Server("loraserve-local", cmd, "/readyz", tmp / "server.log")


class AdapterMaker:
    """Distinct rank-`rank` PEFT LoRAs of the demo base model on q_proj and v_proj.

    One PEFT model is built; each adapter refills its lora_A and lora_B with small random
    values from its own seed and is saved as PEFT saves it (its state dict, its config), so
    the weights move the base model's logits a little and every adapter's bytes differ.
    """

    def __init__(self, rank: int) -> None:
        from peft import LoraConfig, get_peft_model
        from transformers import LlamaForCausalLM

        base = LlamaForCausalLM.from_pretrained(DEMO / "base")
        config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(TARGETS))
        self.model = get_peft_model(base, config)
        with tempfile.TemporaryDirectory() as out:
            self.model.save_pretrained(out)
            self.config = (Path(out) / CONFIG).read_bytes()

    def files(self, seed: int) -> dict[str, bytes]:
        """adapter_config.json and adapter_model.safetensors of the adapter numbered `seed`."""
        from peft import get_peft_model_state_dict

        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
        state = {k: v.contiguous() for k, v in get_peft_model_state_dict(self.model).items()}
        return {CONFIG: self.config, WEIGHTS: save(state, metadata={"format": "pt"})}


def upload(client: httpx.Client, name: str, files: dict[str, bytes]) -> None:
    """POST /v1/adapters as `loraserve adapters upload` does; RuntimeError unless 201."""
    resp = client.post(
        "/v1/adapters", data={"name": name}, files={k: (k, v) for k, v in files.items()}
    )
    if resp.status_code != 201:
        raise RuntimeError(f"upload of {name} failed: HTTP {resp.status_code}: {resp.text[:300]}")


def complete(client: httpx.Client, model: str, max_tokens: int = 1) -> None:
    """One unstreamed completion on `model`, so its adapter is loaded; RuntimeError unless 200."""
    body = {"model": model, "prompt": "def main():\n", "max_tokens": max_tokens, "temperature": 0}
    resp = client.post("/v1/completions", json=body)
    if resp.status_code != 200:
        raise RuntimeError(
            f"completion on {model} failed: HTTP {resp.status_code}: {resp.text[:300]}"
        )


def slab_figures(client: httpx.Client, names: set[str]) -> dict:
    """The slab's figures in /v1/stats, summed over replicas: `resident` (slab_used) and
    `slots` (slab_slots), and where the replica reports its pages (its `slab` object) their
    rank, count and use and its MiB; how many of `names` /v1/stats shows in a slab
    (`in_slab`) or only in the host tier (`on_host`)."""
    stats = client.get("/v1/stats").raise_for_status().json()
    figures: Counter = Counter()
    for replica in stats["replicas"]:
        figures["resident"] += replica.get("slab_used", 0)
        figures["slots"] += replica.get("slab_slots", 0)
        pages = replica.get("slab") if isinstance(replica.get("slab"), dict) else {}
        if not pages.get("pages"):  # a slab of slots reports no pages (0)
            continue
        for key in PAGE_FIGURES:
            if key in pages:
                figures[key] += pages[key]
        for key, name in (("bytes", "MiB"), ("used_bytes", "used_MiB")):
            if key in pages:
                figures[name] += round(pages[key] / 2**20, 1)
        figures["page_rank"] = pages.get("page_rank", 0)
    tiers = Counter(
        "slab" if "slab" in a["residency"].values() else "host"
        for a in stats["adapters"]
        if a["name"] in names and a["residency"]
    )
    return {**figures, "in_slab": tiers["slab"], "on_host": tiers["host"]}


def counters(client: httpx.Client) -> dict[str, float]:
    """The slab's loads and evictions since the server started, summed over replicas (/metrics)."""
    text = client.get("/metrics").raise_for_status().text
    found = dict.fromkeys(COUNTERS, 0.0)
    for key, metric in COUNTERS.items():
        for match in re.finditer(rf"^{metric}(?:{{[^}}]*}})? (\S+)$", text, re.M):
            found[key] += float(match.group(1))
    return found


def describe(figures: dict) -> str:
    """The slab's figures as `key value` pairs, for a table cell."""
    return json.dumps(figures, separators=(", ", ": ")).strip("{}").replace('"', "")
