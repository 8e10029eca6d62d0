"""The Dockerfile installs loraserve as README.md says (same torch pin, the package with the serve
install's extras), on a CUDA base, as a non-root user, serving on port 8000.

CI builds no image, so these checks read the two texts. Each check is a function of the texts,
and the tests feed it mismatched copies to show that it notices a drift.
"""

import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCED_BASH = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
# pip options followed by a value that is not a requirement
VALUED = {
    "-i",
    "--index-url",
    "--extra-index-url",
    "-c",
    "--constraint",
    "-r",
    "--requirement",
    "-f",
    "--find-links",
}


def _join_continuations(text: str) -> str:
    return re.sub(r"\\\n", " ", text)


def pip_installs(shell: str) -> list[list[str]]:
    """The arguments after `pip install` of each such command in a piece of shell."""
    found = []
    for line in _join_continuations(shell).splitlines():
        for command in re.split(r"&&|\|\||;|\|", line):
            argv = shlex.split(command, comments=True)
            for i in range(len(argv) - 1):
                if argv[i] in ("pip", "pip3") and argv[i + 1] == "install":
                    found.append(argv[i + 2 :])
                    break
    return found


def torch_pin_and_target(args: list[str]) -> tuple[str | None, str | None]:
    """The `torch==X` pin and the local package target (`.` or `.[extras]`) of one install."""
    pin = target = None
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in VALUED:
            skip = True
        elif arg.startswith("torch=="):
            pin = arg.removeprefix("torch==")
        elif arg == "." or arg.startswith(".["):
            target = arg
    return pin, target


def extras(target: str) -> frozenset[str]:
    inside = target[2:-1] if target.startswith(".[") else ""
    return frozenset(e.strip() for e in inside.split(",") if e.strip())


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(KEYWORD, rest) of each instruction, comments dropped and continuations joined."""
    kept = "\n".join(line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))
    out = []
    for line in _join_continuations(kept).splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def readme_problems(readme: str) -> tuple[str | None, frozenset[str] | None, list[str]]:
    """README's torch pin, the extras of its serve install, and what is wrong with them."""
    pins, serve_extras, problems = set(), None, []
    for block in FENCED_BASH.findall(readme):
        for args in pip_installs(block):
            pin, target = torch_pin_and_target(args)
            pins |= {pin} if pin else set()
            if target is not None and re.search(r"^\s*loraserve serve\b", block, re.M):
                serve_extras = extras(target)
    if len(pins) != 1:
        problems.append(f"README's pip installs pin torch as {sorted(pins)}, not one version")
    if serve_extras is None:
        problems.append("README has no bash block that installs the package and runs it")
    return (next(iter(pins)) if len(pins) == 1 else None), serve_extras, problems


def problems(dockerfile: str, readme: str) -> list[str]:
    """Where the Dockerfile departs from README's install or from the serving image's rules."""
    pin, serve_extras, found = readme_problems(readme)
    steps = instructions(dockerfile)
    installs = [a for k, rest in steps if k == "RUN" for a in pip_installs(rest)]
    pins = {p for p, _ in map(torch_pin_and_target, installs) if p}
    targets = [t for _, t in map(torch_pin_and_target, installs) if t]
    if not pins or (pin is not None and pins != {pin}):
        found.append(f"Dockerfile pins torch as {sorted(pins)}, README as {pin}")
    if not targets:
        found.append("Dockerfile installs no `.` or `-e .` package")
    for target in targets:
        if serve_extras is not None and extras(target) != serve_extras:
            found.append(
                f"Dockerfile installs {target}, README's serve install has extras "
                f"{sorted(serve_extras)}"
            )
    users = [rest for k, rest in steps if k == "USER"]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        found.append(f"Dockerfile runs as {users[-1] if users else 'root (no USER)'}")
    bases = [
        rest.split()[-1] if rest.startswith("--") else rest.split()[0]
        for k, rest in steps
        if k == "FROM"
    ]
    if not bases or not bases[-1].startswith("nvidia/cuda:"):
        found.append(f"Dockerfile's image is not built on nvidia/cuda: {bases}")
    ports = {p.split("/")[0] for k, rest in steps if k == "EXPOSE" for p in rest.split()}
    if "8000" not in ports:
        found.append(f"Dockerfile exposes {sorted(ports)}, not 8000")
    cmds = [json.loads(rest) for k, rest in steps if k == "CMD"]
    if not cmds or cmds[-1][:2] != ["loraserve", "serve"]:
        found.append(f"Dockerfile's CMD is {cmds[-1] if cmds else None}, not `loraserve serve`")
    return found


def _read(name: str) -> str:
    return (ROOT / name).read_text()


def test_dockerfile_agrees_with_readme():
    assert problems(_read("Dockerfile"), _read("README.md")) == []


def test_the_checks_find_readmes_install_line():
    pin, serve_extras, found = readme_problems(_read("README.md"))
    assert found == [] and pin and serve_extras == frozenset()


@pytest.mark.parametrize(
    ("name", "old", "new", "count", "says"),
    [
        ("README.md", "torch=={pin}", "torch==9.9.0", -1, "Dockerfile pins torch as"),
        (
            "README.md",
            'torch=={pin} -e ".[dev]"',
            'torch==9.9.0 -e ".[dev]"',
            1,
            "not one version",
        ),
        (
            "README.md",
            "pip install torch=={pin} -e .\n",
            "pip install torch=={pin} -e '.[gpu]'\n",
            1,
            "README's serve install has extras ['gpu']",
        ),
        ("Dockerfile", "torch=={pin}", "torch==9.9.0", 1, "Dockerfile pins torch as"),
        ("Dockerfile", " -e . s3fs", " -e .[dev] s3fs", 1, "Dockerfile installs .[dev]"),
        ("Dockerfile", " -e .", "", -1, "installs no `.`"),
        ("Dockerfile", "USER 1000:1000", "USER root", 1, "runs as root"),
        ("Dockerfile", "USER 1000:1000", "", 1, "no USER"),
        ("Dockerfile", "FROM nvidia/cuda:", "FROM ubuntu/cuda:", 1, "not built on nvidia/cuda"),
        ("Dockerfile", "EXPOSE 8000", "EXPOSE 8080", 1, "not 8000"),
    ],
)
def test_a_drift_is_found(name, old, new, count, says):
    texts = {"Dockerfile": _read("Dockerfile"), "README.md": _read("README.md")}
    pin = readme_problems(texts["README.md"])[0]  # the current pin, whichever it is
    old, new = old.format(pin=pin), new.format(pin=pin)
    assert old in texts[name]
    texts[name] = texts[name].replace(old, new, count)
    found = problems(texts["Dockerfile"], texts["README.md"])
    assert any(says in problem for problem in found), found


def test_build_context_leaves_out_local_state():
    ignored = set(_read(".dockerignore").split())
    assert {
        ".git",
        ".venv",
        ".bench-venvs",
        ".loraserve",
        "**/__pycache__",
        "**/.pytest_cache",
        "**/.hypothesis",
        "*.egg-info",
    } <= ignored
