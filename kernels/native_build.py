"""The compiled CPU kernels (kernels/lora_cpu.c, kernels/attention_cpu.c), one library: built,
cached and checked before loading.

Loading a library runs its constructors in this process, so a cached one is loaded only
from a directory no one else can write, and only if its bytes hash to what was built:

  - the cache, ~/.cache/loraserve/native beside the models' cache, is made 0700 (with the
    parents this makes); it is used only while it and every directory from ~/.cache down
    are this user's, writable by no group or others, and (below ~/.cache) not symlinks;
  - each build records the library's SHA-256: in this process, and in a `.sha256` file
    beside it for later processes. The library's bytes are hashed right before it is
    loaded; one that matches neither is built again, never loaded.

A cache that fails those checks is not trusted and not repaired: the library is built into
a fresh private temporary directory instead (mkdtemp: 0700, an unguessable name), loaded
from there and deleted, with a warning that names the directory and why. A build takes
about 0.1 s, so this costs little, where the torch path would cost every step its speed.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

_SOURCES = tuple(Path(__file__).with_name(name) for name in ("lora_cpu.c", "attention_cpu.c"))
# No -ffast-math: in a shared object it may set flush-to-zero for the whole process. These
# let the compiler vectorise the dot products' sums without changing NaN or Inf handling.
_FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-fopenmp", "-fno-trapping-math",
          "-fassociative-math", "-fno-signed-zeros")  # fmt: skip
_CACHE_PARTS = (".cache", "loraserve", "native")  # under the home directory
_built: dict[Path, str] = {}  # the libraries this process built -> their SHA-256


def load(symbol: str, argtypes: list, restype=None, what: str = "") -> ctypes._CFuncPtr | None:
    """symbol of the library, typed, or None (with a warning naming `what`) where it cannot be
    had: no compiler, a failed build, or LORASERVE_CPU_NATIVE=0; the caller's torch path runs."""
    if os.environ.get("LORASERVE_CPU_NATIVE", "1") == "0":
        return None
    try:
        with library() as path:  # its bytes hashed just now: load nothing else
            fn = getattr(ctypes.CDLL(str(path)), symbol)
    except Exception as err:  # anything at all: the torch path serves instead
        log.warning("%s is unavailable (%s); using the torch path", what or symbol, err)
        return None
    fn.argtypes, fn.restype = argtypes, restype
    return fn


class NotPrivate(OSError):
    """The cache directory, or one above it, may be written by someone else."""


@contextlib.contextmanager
def library() -> Iterator[Path]:
    """A library for this source, these flags and this CPU whose bytes were hashed just now
    and match its build's digest: cached, or built, for the caller to load inside the block."""
    compiler = _compiler()
    name = f"cpu_kernels-{_key()}.so"
    try:
        directory = private_dir()
    except OSError as err:  # NotPrivate, or a home where nothing can be made (read-only)
        log.warning("%s; building the compiled CPU kernels in a private temporary directory", err)
        with tempfile.TemporaryDirectory(prefix="loraserve-native-") as fresh:
            yield _verified(Path(fresh) / name, compiler)
        return
    yield _verified(directory / name, compiler)


def private_dir() -> Path:
    """~/.cache/loraserve/native, each missing part made 0700; NotPrivate where one is not
    this user's alone (see the module's docstring)."""
    path = Path.home()
    for part in _CACHE_PARTS:
        path = path / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # mkdir's mode passes through the umask
        # ~/.cache may be a link to a larger disk; below it, the directories are ours alone.
        info = os.stat(path) if part == _CACHE_PARTS[0] else os.lstat(path)
        problem = _not_private(info, directory=True)
        if problem:
            raise NotPrivate(f"the kernel cache {path} is {problem}")
    return path


def _not_private(info: os.stat_result, *, directory: bool) -> str | None:
    """Why a file or directory with this stat may be written by someone else, or None."""
    kind = stat.S_ISDIR if directory else stat.S_ISREG
    if not kind(info.st_mode):
        return "a symlink" if stat.S_ISLNK(info.st_mode) else "not a plain directory or file"
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not this user's ({os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _verified(target: Path, compiler: list[str]) -> Path:
    """target, its bytes hashed just now and matching its build's digest; built where not."""
    expected = _built.get(target) or _recorded(target)
    if expected is None or _digest(target) != expected:
        _build(target, compiler)
        if _digest(target) != _built[target]:  # replaced meanwhile, by a replica starting too?
            raise RuntimeError(f"{target} changed after it was built; not loading it")
    return target


def _private_bytes(path: Path) -> bytes | None:
    """The regular file at path (not through a symlink), where it is this user's alone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return None if _not_private(os.fstat(fd), directory=False) else f.read()


def _digest(path: Path) -> str | None:
    """The SHA-256 of path's bytes (see _private_bytes), or None."""
    data = _private_bytes(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


def _recorded(target: Path) -> str | None:
    """The digest a build wrote beside target, where that file is this user's alone."""
    data = _private_bytes(target.with_suffix(".sha256"))
    text = data.decode(errors="replace").strip() if data is not None else ""
    return text if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else None


def _build(target: Path, compiler: list[str]) -> None:
    """Compiles the source to target and records its digest, here and beside it."""
    # Built beside the target, then renamed: replicas starting together never load half a file.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built, sidecar = Path(scratch) / target.name, Path(scratch) / "digest"
        done = subprocess.run(
            [*compiler, *_FLAGS, *map(str, _SOURCES), "-lm", "-o", str(built)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(compiler)} failed: {done.stderr.strip()[-500:]}")
        os.chmod(built, 0o700)  # as the umask left it, group-writable (002) would be refused
        digest = _digest(built)
        if digest is None:
            raise RuntimeError(f"{shlex.join(compiler)} wrote no private file at {built}")
        sidecar.write_text(digest + "\n")
        os.chmod(sidecar, 0o600)
        os.replace(built, target)
        os.replace(sidecar, target.with_suffix(".sha256"))
    _built[target] = digest


def _compiler() -> list[str]:
    """$CC split into words as a shell would (CC="ccache gcc"), else cc or gcc on PATH."""
    words = shlex.split(os.environ.get("CC", ""))
    if not words:
        found = shutil.which("cc") or shutil.which("gcc")
        if found is None:
            raise RuntimeError("no C compiler (cc or gcc) on PATH")
        words = [found]
    return words


def _key() -> str:
    """The cache key: the sources', the flags' and the CPU's hash."""
    key = hashlib.sha256()
    sources = [source.read_bytes() for source in _SOURCES]
    for part in (*sources, " ".join(_FLAGS).encode(), _cpu_identity().encode()):
        key.update(part)
    return key.hexdigest()[:16]


def _cpu_identity() -> str:
    """What -march=native compiles for: the machine and its CPU's model and feature flags."""
    identity = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags", "Features")):
                identity += line
                if line.startswith(("flags", "Features")):
                    break
    except OSError:
        pass
    return identity
