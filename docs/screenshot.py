"""Screenshot the dashboard of a running demo server while traffic runs on it.

    loraserve serve &   # the demo, then once /readyz answers 200:
    python docs/screenshot.py --url http://127.0.0.1:8000 --out docs/dashboard.png

Drives completions on the base model and the demo adapters from a few threads, submits a
batch halfway, lets the page's charts fill, and saves a 1280x800 shot of the page taken with
Debian's chromium (`LORASERVE_CHROMIUM` or `chromium` on PATH) through Playwright.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import threading
import time

import httpx
from playwright.sync_api import sync_playwright

MODELS = ("demo", "demo:upper", "demo:comment", "demo:rot13", "demo:upper")
PROMPTS = ("def read_lines(path):\n", "class Queue:\n", "import os\n", "def main():\n")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]  # fmt: skip


def traffic(url: str, stop: threading.Event, worker: int) -> None:
    """Completions, one after another, across the models, until stop is set."""
    n = worker
    with httpx.Client(base_url=url, timeout=120) as client:
        while not stop.is_set():
            body = {"model": MODELS[n % len(MODELS)], "prompt": PROMPTS[n % len(PROMPTS)],
                    "max_tokens": 48, "temperature": 0.2, "repetition_penalty": 1.2}  # fmt: skip
            client.post("/v1/completions", json=body)
            n += 3


def submit_batch(url: str, n: int) -> None:
    """A Workers-AI-shaped queued batch of n prompts under the comment adapter."""
    requests = [{"prompt": PROMPTS[i % len(PROMPTS)], "lora": "comment", "max_tokens": 32,
                 "repetition_penalty": 1.2} for i in range(n)]  # fmt: skip
    r = httpx.post(f"{url}/ai/run/demo?queueRequest=true", json={"requests": requests},
                   timeout=60)  # fmt: skip
    r.raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--out", default="docs/dashboard.png")
    parser.add_argument("--seconds", type=float, default=40, help="traffic before the shot")
    parser.add_argument("--workers", type=int, default=3)
    args = parser.parse_args()
    chromium = os.environ.get("LORASERVE_CHROMIUM") or shutil.which("chromium")
    if chromium is None:
        raise SystemExit("chromium not found: apt-get install chromium")
    stop = threading.Event()
    threads = [threading.Thread(target=traffic, args=(args.url, stop, i), daemon=True)
               for i in range(args.workers)]  # fmt: skip
    for t in threads:
        t.start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{args.url}/dashboard")
            # Interactive traffic alone first: a few streams leave room for speculative
            # decoding (the demo drafts up to 8 running sequences); then a batch joins.
            time.sleep(args.seconds / 2)
            submit_batch(args.url, 120)
            time.sleep(args.seconds / 2)
            page.screenshot(path=args.out, full_page=True)
            latest = page.get_attribute("#chart-tokens", "data-latest")
            browser.close()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=130)
    print(f"saved {args.out}; tokens chart: {json.loads(latest or 'null')}")


if __name__ == "__main__":
    main()
