"""Where a model's files are, and its weights as tensors: the checkpoint side of loading.

A model is a local folder or an fsspec URI (s3://, gs://, memory://, file://, ...). A URI is
copied once into the local cache and the copy is reused from then on (the cache is keyed by the
URI alone, so a model changed in place at the same URI needs its cache entry removed).
Weights are read only from safetensors: one model.safetensors, or shards listed by
model.safetensors.index.json. Pickle checkpoints (pytorch_model.bin) are refused, because
unpickling runs code from the file.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

import fsspec
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from serving.model.errors import ModelLoadError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_CONVERT_HINT = (
    "convert it once: AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(NEW_DIR) "
    "writes safetensors"
)


def model_folder(path_or_uri: str | Path) -> Path:
    """resolve_model_path into this machine's cache, ~/.cache/loraserve/models."""
    return resolve_model_path(path_or_uri, Path.home() / ".cache" / "loraserve" / "models")


def resolve_model_path(path_or_uri: str | Path, cache_dir: str | Path) -> Path:
    """The local folder of a model: a folder as given, or the cached copy of an fsspec URI."""
    text = str(path_or_uri)
    if "://" not in text:
        path = Path(path_or_uri)
        if not path.is_dir():
            what = "is not a folder" if path.exists() else "not found"
            raise ModelLoadError(f"model path {text}: {what}")
        return path
    cache = Path(cache_dir)
    dest = cache / hashlib.sha256(text.encode()).hexdigest()
    if dest.is_dir():
        return dest
    try:
        fs, root = fsspec.core.url_to_fs(text)
        found = fs.isdir(root)
    except Exception as exc:  # any backend's failure (unknown protocol, auth, network)
        raise ModelLoadError(f"model {text}: cannot open it: {exc}") from None
    if not found:
        raise ModelLoadError(f"model {text}: not found (no folder at that URI)")
    cache.mkdir(parents=True, exist_ok=True)
    # One copy per machine: the replicas (and the app's builder) on one node that start
    # together wait on this lock for the first one's copy instead of each copying the model.
    with open(cache / f"{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not dest.is_dir():
            _copy_into(fs, root, text, cache, dest)
    return dest


def _copy_into(fs: fsspec.AbstractFileSystem, root: str, text: str, cache: Path, dest: Path):
    """Copy the URI's folder to dest through a temporary folder renamed when complete."""
    part = Path(tempfile.mkdtemp(prefix=f"{dest.name}.part-", dir=cache))
    try:
        _copy_tree(fs, root, part, text)
        try:
            os.rename(part, dest)  # atomic: a reader sees the whole copy or none of it
        except OSError:
            if not dest.is_dir():  # else another process finished the same copy first
                raise
    except OSError as exc:
        raise ModelLoadError(f"model {text}: copy into {cache} failed: {exc}") from None
    finally:
        shutil.rmtree(part, ignore_errors=True)


def _copy_tree(fs: fsspec.AbstractFileSystem, root: str, dest: Path, uri: str) -> None:
    root = root.rstrip("/")
    try:
        files = fs.find(root)
        for remote in files:
            rel = PurePosixPath(remote).relative_to(root)
            local = dest.joinpath(*rel.parts)
            local.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(remote, str(local))
    except OSError:
        raise
    except Exception as exc:  # backend errors that are not OSError
        raise ModelLoadError(f"model {uri}: copy failed: {exc}") from None


def load_state_dict(model_dir: str | Path) -> dict[str, Tensor]:
    """Every tensor of the checkpoint by its stored name, dtype and shape, on the CPU.

    A model saved with tied embeddings may have no lm_head.weight; the caller ties it.
    """
    folder = Path(model_dir)
    if (folder / SINGLE_FILE).is_file():
        return _read_safetensors(folder / SINGLE_FILE)
    if (folder / INDEX_FILE).is_file():
        return _load_sharded(folder)
    pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(
        p.name for p in folder.glob("*.pt*")
    )
    if pickles:
        raise ModelLoadError(
            f"{folder}: refusing pickle weights {pickles[0]} (loading runs code); {_CONVERT_HINT}"
        )
    raise ModelLoadError(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE}")


def _load_sharded(folder: Path) -> dict[str, Tensor]:
    index_path = folder / INDEX_FILE
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{index_path}: not a safetensors index ({exc})") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"{index_path}: weight_map is empty or not an object")
    by_shard: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        by_shard.setdefault(str(shard), []).append(tensor)
    for name in sorted(by_shard):
        parts = PurePosixPath(name).parts
        if len(parts) != 1 or parts[0] in (".", ".."):
            raise ModelLoadError(f"{index_path}: shard name {name!r} is not a file in the folder")
        if not (folder / name).is_file():
            raise ModelLoadError(f"{index_path}: shard {name} is missing from {folder}")
    state: dict[str, Tensor] = {}
    for name, listed in sorted(by_shard.items()):
        tensors = _read_safetensors(folder / name)
        for tensor in listed:
            if tensor not in tensors:
                raise ModelLoadError(f"{index_path}: tensor {tensor} is not in shard {name}")
        state.update(tensors)
    return state


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    try:
        return load_file(path, device="cpu")
    except (SafetensorError, OSError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
