"""How the compiled CPU LoRA library is built, cached and checked before it is loaded: a
library someone else could have planted is never loaded (its constructor never runs)."""

import logging
import os
import shutil
import subprocess
import tempfile

import pytest
import torch

from kernels import lora_apply_planned, lora_native, native_build
from kernels.lora_reference import expand_oracle, shrink_oracle
from tests.kernels.test_cpu_plan_ways import make
from tests.kernels.test_lora_native import needs_compiler, spy

pytestmark = needs_compiler

# Loaded, it writes MARKER: as a library planted in the cache would run code of its own.
PLANTED_C = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("ran", f); fclose(f); }
}
void lora_apply_rows(void) {}
"""


@pytest.fixture
def home(monkeypatch, tmp_path):
    """A new process's view: nothing loaded or built, an empty home, its own temporary dir."""
    new_process(monkeypatch)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path


@pytest.fixture
def cache(home):
    """Where the library is cached."""
    return home / ".cache" / "loraserve" / "native"


def target(cache_dir):
    return cache_dir / f"cpu_kernels-{native_build._key()}.so"


def plant(path, marker) -> None:
    """A library at path whose constructor writes marker, with its true digest beside it."""
    source = path.parent / "planted.c"
    source.write_text(PLANTED_C)
    compiler = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([compiler, "-shared", "-fPIC", f'-DMARKER="{marker}"', str(source), "-o",
                    str(path)], check=True)  # fmt: skip
    source.unlink()
    path.with_suffix(".sha256").write_text(native_build._digest(path) + "\n")


def new_process(monkeypatch) -> None:
    """Forget what this process loaded and built, as a replica starting later would."""
    monkeypatch.setattr(lora_native, "_kernel", None)
    monkeypatch.setattr(lora_native, "_tried", False)
    monkeypatch.setattr(native_build, "_built", {})


def runs_like_the_oracle(monkeypatch) -> None:
    calls = spy(monkeypatch)
    x, a, b, scales, ids, ranks, segments = make("four each", torch.float32, (40, 8), "per slot")
    y = torch.zeros(x.shape[0], 48)
    lora_apply_planned(x, a, b, y, segments, scales, 16)
    assert calls == [1]
    want = expand_oracle(torch.zeros_like(y), shrink_oracle(x, a, ids, ranks), b, ids, ranks,
                         scales)  # fmt: skip
    torch.testing.assert_close(y.double(), want, atol=2e-4, rtol=2e-4)


def test_the_cache_and_the_parents_it_makes_are_private(cache, home):
    assert lora_native.available()
    for path in (home / ".cache", cache.parent, cache):
        assert os.stat(path).st_mode & 0o777 == 0o700, path
    built = target(cache)
    assert built.with_suffix(".sha256").read_text().strip() == native_build._digest(built)


def test_a_cached_build_is_reused_without_compiling(cache, monkeypatch):
    with native_build.library() as first:
        pass
    new_process(monkeypatch)  # so the digest beside the library is what vouches for it
    monkeypatch.setenv("CC", "false")  # would fail if it compiled again
    with native_build.library() as again:
        assert again == first


@pytest.mark.parametrize("digest", [None, "0" * 64], ids=["no digest", "another digest"])
def test_a_planted_library_without_its_build_s_digest_is_never_loaded(cache, monkeypatch, digest):
    """A library at the expected path in a private cache, with no digest beside it or with
    another library's, is replaced by a build of ours before anything is loaded."""
    cache.mkdir(parents=True, mode=0o700)
    marker = cache.parent / "marker"
    plant(target(cache), marker)
    sidecar = target(cache).with_suffix(".sha256")
    sidecar.unlink() if digest is None else sidecar.write_text(digest)
    assert lora_native.available()
    assert not marker.exists(), "loaded the planted library"
    assert native_build._digest(target(cache)) == sidecar.read_text().strip()
    runs_like_the_oracle(monkeypatch)


@pytest.mark.parametrize("how", ["mode 0777", "another owner", "a symlink", "parent 0777"])
def test_a_cache_someone_else_may_write_is_not_used(cache, home, monkeypatch, caplog, how):
    """Even a library with its true digest beside it is not loaded from a cache that is not
    this user's alone: the kernel is built in a fresh private directory, which then goes."""
    real = home / "elsewhere" if how == "a symlink" else cache
    real.mkdir(parents=True, mode=0o700)
    if how == "a symlink":
        cache.parent.mkdir(parents=True, mode=0o700)
        cache.symlink_to(real)
    marker = home / "marker"
    plant(target(real), marker)
    if how == "mode 0777":
        cache.chmod(0o777)
    if how == "parent 0777":
        cache.parent.chmod(0o777)
    if how == "another owner":
        owned_by_another(home / ".cache", monkeypatch)
    with caplog.at_level(logging.WARNING, logger="kernels.native_build"):
        assert lora_native.available()
    assert not marker.exists(), "loaded the planted library"
    why = {"mode 0777": f"{cache} is writable by group or others (mode 0777)",
           "another owner": f"{home / '.cache'} is owned by uid {os.getuid() + 1}",
           "a symlink": f"{cache} is a symlink",
           "parent 0777": f"{cache.parent} is writable by group or others"}[how]  # fmt: skip
    assert why in caplog.text and "private temporary directory" in caplog.text
    assert os.listdir(tempfile.gettempdir()) == [], "left the private build behind"
    runs_like_the_oracle(monkeypatch)


def owned_by_another(root, monkeypatch) -> None:
    """stat and lstat say that root and everything under it is uid + 1's."""
    for name in ("stat", "lstat"):
        real = getattr(os, name)

        def faked(path, *args, real=real, **kwargs):
            info = real(path, *args, **kwargs)
            if not str(path).startswith(str(root)):
                return info
            fields = list(info)
            fields[4] = info.st_uid + 1  # st_uid
            return os.stat_result(fields)

        monkeypatch.setattr(os, name, faked)


def test_a_tampered_cached_library_is_built_again(cache, monkeypatch):
    """Bytes changed after the build (the digest beside them kept): rebuilt, then it runs as
    the oracle does. (Built, not loaded, first: a process never loads a path twice.)"""
    with native_build.library() as built:
        good = built.read_bytes()
    built.write_bytes(good[:-64] + b"\x90" * 64)
    new_process(monkeypatch)
    assert lora_native.available()
    assert built.read_bytes() == good
    runs_like_the_oracle(monkeypatch)


def test_a_cached_library_that_does_not_load_is_built_again(cache):
    with native_build.library() as built:
        pass
    built.write_bytes(b"")  # as a crash mid-write might leave it
    assert lora_native.available()
    assert built.stat().st_size > 0


def test_cc_of_several_words(cache, monkeypatch):
    """CC="ccache gcc" style: a launcher and its compiler."""
    monkeypatch.setenv("CC", f"env {shutil.which('cc') or shutil.which('gcc')}")
    assert lora_native.available()
    assert target(cache).exists()


def test_a_umask_that_lets_the_group_write_still_caches(cache, monkeypatch):
    """Under umask 002 the build's files come out group-writable; they are made private, so
    a later process loads them instead of building again."""
    old = os.umask(0o002)
    try:
        with native_build.library() as first:
            pass
        new_process(monkeypatch)
        monkeypatch.setenv("CC", "false")  # would fail if it compiled again
        with native_build.library() as again:
            assert again == first
    finally:
        os.umask(old)
    assert os.stat(cache).st_mode & 0o777 == 0o700
