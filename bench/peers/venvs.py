"""Per-peer virtualenvs, created by the benchmark itself so that a clone reproduces them.

``ensure_venv(name, packages)`` creates ``root/name`` once with ``python -m venv``,
installs ``torch==2.13.0`` first (a CPU wheel: pinning it keeps pip from pulling a
multi-GB CUDA build; ``PIP_FIND_LINKS`` may point at a local wheel), then the
packages, then removes packages that break the peer (for vLLM's CPU build:
torchvision/torchaudio/torchcodec, whose PyPI builds need CUDA). A marker file
records a completed install, so later calls return at once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

TORCH_PIN = "torch==2.13.0"
MARKER = ".loraserve-complete.json"

# Packages to uninstall after installing a peer whose name matches the key.
_UNINSTALL_AFTER = {
    "vllm": ["torchvision", "torchaudio", "torchcodec"],
}


def _log(msg: str) -> None:
    print(f"[venvs] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str]) -> None:
    _log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=sys.stderr)  # stdout is the benchmark's table


def _uninstalls_for(name: str, packages: list[str]) -> list[str]:
    out: list[str] = []
    for key, pkgs in _UNINSTALL_AFTER.items():
        if key in name or any(
            p.split("=")[0].split("<")[0].split(">")[0].startswith(key) for p in packages
        ):
            out += [p for p in pkgs if p not in out]
    return out


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(name: str, packages: list[str], root: Path = Path(".bench-venvs")) -> Path:
    """Create (once) the virtualenv ``root/name`` with ``packages``; return its python path."""
    venv = Path(root).absolute() / name
    py = venv_python(venv)
    marker = venv / MARKER
    wanted = {"torch": TORCH_PIN, "packages": list(packages)}
    if marker.exists() and py.exists():
        try:
            done = json.loads(marker.read_text())
        except ValueError:
            done = None
        if (
            done is not None
            and done.get("torch") == wanted["torch"]
            and done.get("packages") == wanted["packages"]
        ):
            _log(f"reusing {venv}")
            return py
        _log(f"{venv}: marker does not match {wanted}; reinstalling")
    t0 = time.perf_counter()
    _log(f"creating {venv} for {packages}")
    venv.parent.mkdir(parents=True, exist_ok=True)
    if marker.exists():
        marker.unlink()
    _run([sys.executable, "-m", "venv", "--clear", str(venv)])
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
    _run([*pip, "--upgrade", "pip"])
    _run([*pip, TORCH_PIN])
    # Keep the torch pin while installing the peer, so its resolver cannot swap torch.
    if packages:
        _run([*pip, TORCH_PIN, *packages])
    drop = _uninstalls_for(name, packages)
    if drop:
        _run([str(py), "-m", "pip", "uninstall", "-y", *drop])
    seconds = time.perf_counter() - t0
    freeze = subprocess.run([str(py), "-m", "pip", "freeze"], capture_output=True, text=True).stdout
    marker.write_text(
        json.dumps(
            {**wanted, "install_seconds": round(seconds, 1), "freeze": freeze.splitlines()},
            indent=1,
        )
    )
    _log(f"{venv} ready in {seconds:.0f} s")
    return py


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("name")
    ap.add_argument("packages", nargs="*")
    ap.add_argument("--root", type=Path, default=Path(".bench-venvs"))
    a = ap.parse_args()
    print(ensure_venv(a.name, a.packages, a.root))
