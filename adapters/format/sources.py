"""Reading an adapter's files from a folder, a .tar.gz / .zip archive, or uploaded bytes.

Everything is read into memory under a size limit; archive members are
matched by base name and never extracted, so paths inside an archive cannot
point anywhere.
"""

from __future__ import annotations

import tarfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

from adapters.errors import AdapterError

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PICKLE_WEIGHTS = "adapter_model.bin"
WANTED = (CONFIG, WEIGHTS, PICKLE_WEIGHTS)
DEFAULT_MAX_BYTES = 2 * 2**30
_ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip")


def read_adapter_files(
    source: str | Path | Mapping[str, bytes], max_bytes: int = DEFAULT_MAX_BYTES
):
    """{file name: bytes} of an adapter's files (config, weights, or refused pickle weights)."""
    if isinstance(source, Mapping):
        files = {k: bytes(v) for k, v in source.items() if k in WANTED}
        for name, data in files.items():
            _check_size(name, len(data), max_bytes)
        return files
    path = Path(source)
    if path.is_dir():
        return _from_dir(path, max_bytes)
    if path.is_file() and path.name.endswith(_ARCHIVES):
        return _from_archive(path, max_bytes)
    if not path.exists():
        raise AdapterError(f"{path}: no such file or folder")
    raise AdapterError(
        f"{path}: expected a folder, a .tar.gz or a .zip holding {CONFIG} and {WEIGHTS}"
    )


def _from_dir(path: Path, max_bytes: int) -> dict[str, bytes]:
    files = {}
    for name in WANTED:
        f = path / name
        if f.is_file():
            _check_size(name, f.stat().st_size, max_bytes)
            files[name] = f.read_bytes()
        elif f.exists():
            raise AdapterError(f"{f}: not a file")
    return files


def _from_archive(path: Path, max_bytes: int) -> dict[str, bytes]:
    _check_size(path.name, path.stat().st_size, max_bytes)
    found: dict[str, bytes] = {}
    try:
        if path.name.endswith(".zip"):
            with zipfile.ZipFile(path) as z:
                for info in z.infolist():
                    name = _wanted(info.filename)
                    if name and not info.is_dir():
                        _check_size(name, info.file_size, max_bytes)
                        found[name] = z.read(info)
        else:
            with tarfile.open(path) as t:
                for member in t.getmembers():
                    name = _wanted(member.name)
                    if name and member.isfile():
                        _check_size(name, member.size, max_bytes)
                        found[name] = t.extractfile(member).read()
                    elif name and (member.issym() or member.islnk()):
                        raise AdapterError(f"{path.name}: {_shown(member.name)} is a link; an "
                                           f"archive's files are read only as plain files")  # fmt: skip
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise AdapterError(f"{path.name}: not a readable archive ({exc})") from None
    return found


def _wanted(member: str) -> str | None:
    """The file an archive member is, by base name, at the top or one folder down."""
    parts = [p for p in member.replace("\\", "/").split("/") if p not in ("", ".")]
    if 1 <= len(parts) <= 2 and parts[-1] in WANTED:
        return parts[-1]
    return None


def _shown(member: str) -> str:
    return repr(member if len(member) <= 80 else member[:77] + "...")


def _check_size(name: str, size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise AdapterError(f"{name}: {size} bytes is over the limit of {max_bytes} bytes")
