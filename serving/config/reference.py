"""docs/config.md, rendered from the config's models: every section and key with its type,
default and description, then the environment variables the server and its CLI read.

Regenerate after changing a section:  python -m serving.config.reference > docs/config.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from serving.config.serve_config import ServeConfig

REGENERATE = "python -m serving.config.reference > docs/config.md"

# (name, what it does). Names are read in serving/, kernels/ and adapters/; tests/test_docs.py
# fails when one read there is missing here.
ENVIRONMENT = (
    ("LORASERVE_API_KEYS", "API keys as `KEY:TENANT:SCOPE,...` (scope `user` or `admin`), "
     "besides `server.api_keys_file`; read where the app is built and handed to every replica."),
    ("LORASERVE_API_KEY", "The key `loraserve adapters` and `loraserve batch` send to a server."),
    ("LORASERVE_CHECKS", "`1`: a model checks every layer's attention arguments, where a server "
     "checks a step once (the tests set it)."),
    ("LORASERVE_CPU_NATIVE", "`0`: the CPU decode step's LoRA and a step's attention run in torch "
     "instead of the compiled `kernels/lora_cpu.c` and `kernels/attention_cpu.c`."),
    ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "Entries in oneDNN's primitive cache, which holds one "
     "JIT-built primitive (about 0.3 MB) per CPU linear weight and row count; default 256 "
     "(`kernels/cpu_gemm.py`'s `CACHE_CAPACITY`), room for the 27 row counts (`ROW_BUCKETS`) of "
     "nine weight shapes. torch's own default, 1,024, let a CPU replica grow by "
     "hundreds of MB."),
    ("LRU_CACHE_CAPACITY", "Entries in ideep's cache in front of oneDNN's, which holds the same "
     "primitives again; default 256, as `ONEDNN_PRIMITIVE_CACHE_CAPACITY`."),
    ("CC", "The C compiler that builds the CPU kernels (`kernels/*.c`), split into words as a shell would "
     "(`ccache gcc`); unset: `cc` or `gcc` on PATH."),
    ("LORASERVE_LORA_CONFIGS", "A file of tuned Triton LoRA launch configurations to read "
     "instead of `kernels/tuned/<GPU name>.json` (it must exist)."),
    ("XDG_CACHE_HOME", "Holds `loraserve/ray`, the local Ray's temporary folder, when that path "
     "is short enough for Ray's sockets (else the temp dir); default `~/.cache`."),
    ("XDG_STATE_HOME", "Holds `loraserve/logs`, where `loraserve serve` writes Ray's output; "
     "default `~/.local/state`."),
    ("PYTHONPATH", "Passed on to the grammar compiler's worker processes, the repository root "
     "put first."),
)  # fmt: skip


def render() -> str:
    """The whole of docs/config.md."""
    sections = list(_sections(ServeConfig))
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Rendered from serving/config by `{REGENERATE}`; edit the models, not this. -->",
        "",
        "`loraserve serve --config PATH` reads one YAML file of the sections below (without "
        "`--config`, `configs/demo.yaml`). Every section and key is optional and takes the "
        "default shown; an empty section means all its defaults. An unknown key is an error "
        "naming the keys allowed there. Relative paths resolve against the working directory.",
        "",
        *(f"- [`{name}`](#{_anchor(name)}): {_doc(model)}" for name, model in sections),
        "- [Environment variables](#environment-variables)",
    ]
    for name, model in sections:
        lines += ["", f"## {name}", "", _doc(model), "", "| key | type | default | what it sets |"]
        lines += ["| --- | --- | --- | --- |"]
        schema = model.model_json_schema()
        for key, field in model.model_fields.items():
            if _section_of(field.annotation) is not None:
                continue  # a sub-section, with a table of its own
            kind = _type(schema["properties"][key], schema.get("$defs", {}))
            text = _cell(field.description or "")
            lines.append(f"| `{key}` | {kind} | `{_default(field.default)}` | {text} |")
    lines += ["", "## Environment variables", "", "| variable | what it does |", "| --- | --- |"]
    lines += [f"| `{name}` | {text} |" for name, text in ENVIRONMENT]
    return "\n".join(lines) + "\n"


def _sections(model: type[BaseModel], prefix: str = ""):
    """(dotted name, model) of every section inside model, depth first."""
    for key, field in model.model_fields.items():
        inner = _section_of(field.annotation)
        if inner is None:
            continue
        name = f"{prefix}{key}" + (".NAME" if get_origin(field.annotation) is dict else "")
        yield name, inner
        yield from _sections(inner, f"{name}.")


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The section class a field holds, directly or as {name: section}; None for a value."""
    if get_origin(annotation) is dict:
        annotation = get_args(annotation)[1]
    return (
        annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    )


def _anchor(heading: str) -> str:
    """The fragment a Markdown viewer gives a heading: lower case, dots dropped."""
    return heading.replace(".", "").lower()


def _doc(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").split())


def _type(prop: dict, defs: dict) -> str:
    """A field's JSON schema as words: `auto` or integer, integer > 0, {name: path}, ..."""
    if "$ref" in prop:
        return _type(defs[prop["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in prop:
        return " or ".join(_type(p, defs) for p in prop["anyOf"])
    if "const" in prop:
        return f"`{prop['const']}`"
    if "enum" in prop:
        return ", ".join(f"`{v}`" for v in prop["enum"])
    kind = prop.get("type")
    if kind == "object":
        inner = prop.get("additionalProperties")
        return f"{{name: {_type(inner, defs)}}}" if isinstance(inner, dict) else "section"
    if prop.get("format") == "path":
        return "path"
    bounds = [
        f"{word} {prop[key]}"
        for key, word in (("exclusiveMinimum", ">"), ("minimum", ">="), ("maximum", "<="))
        if key in prop
    ]
    return f"{kind} {', '.join(bounds)}" if bounds else kind


def _default(value: Any) -> str:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _cell(text: str) -> str:
    """Text for a table cell: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


if __name__ == "__main__":
    sys.stdout.write(render())
