"""A grammar compile in a process of its own, so that one can be stopped: both ends of it.

xgrammar cannot stop a compile once it has begun, but its process can be killed, and its CPU
is free at once. The child (`python -m serving.engine.grammar.process`) loads xgrammar's
native bindings only: not xgrammar's package, which imports transformers and torch (hundreds
of MiB per process, for nothing a compile needs). It runs at the lowest CPU priority, so
compiles take what the step loop leaves. It reads one JSON line per compile and answers the
compiled grammar as xgrammar's own serialization, which the engine reads back against its
own tokenizer info. A dead parent closes the child's stdin, and the child ends.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

NICE = 19  # the child's CPU priority: the step loop's rows come first
START_S = 60.0  # how long a new process may take to load the bindings and the vocabulary
ROOT = str(Path(__file__).resolve().parents[3])  # where `serving` is importable from


class CompileProcess:
    """One child process: compile(schema, strict) starts a compile, reply() waits for it."""

    def __init__(self, tokenizer_info: str):
        """tokenizer_info: xgrammar's TokenizerInfo.serialize_json() of the engine's vocabulary."""
        path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "serving.engine.grammar.process"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": path},
        )  # fmt: skip
        try:
            self._send({"tokenizer_info": tokenizer_info})
            if self.reply(START_S) != {"ready": True}:
                raise RuntimeError("the grammar compile process did not start")
        except BaseException:
            self.kill()
            raise

    @property
    def pid(self) -> int:
        return self._proc.pid

    def compile(self, schema: str, strict: bool, kind: str = "json_schema") -> None:
        """Start compiling schema (JSON text, as prepared for xgrammar: a JSON schema, or a
        structural tag when kind says so); reply() answers it."""
        self._send({"schema": schema, "strict": strict, "kind": kind})

    def reply(self, timeout: float) -> dict | None:
        """{"ok": the serialized grammar} or {"error": why}; None if none came within timeout.
        EOFError when the process died."""
        ready, _, _ = select.select([self._proc.stdout], [], [], max(timeout, 0.0))
        if not ready:
            return None
        line = self._proc.stdout.readline()
        if not line:
            raise EOFError("the grammar compile process died")
        return json.loads(line)

    def kill(self) -> None:
        """Stop the process now, mid-compile or not, and reap it."""
        self._proc.kill()
        self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            pipe.close()

    def _send(self, message: dict) -> None:
        self._proc.stdin.write(json.dumps(message).encode() + b"\n")
        self._proc.stdin.flush()


def serve() -> None:
    """The child: read compiles from stdin, answer each on stdout, until stdin closes."""
    import importlib.util
    import types

    sys.modules["torch"] = None  # tvm_ffi imports torch when it can: a compile needs none
    package = types.ModuleType("xgrammar")  # its bindings without its __init__ (see above)
    package.__path__ = list(importlib.util.find_spec("xgrammar").submodule_search_locations)
    sys.modules["xgrammar"] = package
    import xgrammar.load_binding  # noqa: F401 (registers the native types first)
    from xgrammar.base import _core

    from serving.engine.grammar.ebnf import no_raw_controls, reparseable
    from serving.engine.grammar.formats import tag_schemas

    os.nice(NICE)
    if sys.platform == "linux":  # a parent killed mid-compile ends this one too (PR_SET_PDEATHSIG)
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer

    def answer(message: dict) -> None:
        stdout.write(json.dumps(message).encode() + b"\n")
        stdout.flush()

    def json_args(schema: str, strict: bool) -> tuple:
        # Compact JSON (", " and ": " between items, no other whitespace): a model that
        # may add whitespace anywhere can pad forever, and never close the object.
        # (schema, any_whitespace, indent, separators, strict, max whitespace, print, any order)
        return schema, False, None, None, strict, None, False, False

    def json_ebnf(schema: str, strict: bool) -> str:
        grammar = _core.Grammar.from_json_schema(*json_args(schema, strict))
        return no_raw_controls(reparseable(str(grammar.to_string())))

    info = _core.TokenizerInfo.deserialize_json(json.loads(stdin.readline())["tokenizer_info"])
    # (tokenizer info, threads, cache, cache limit, dynamic compilation): one thread, as the
    # parent's pool decides how many compile at once; no cache, the parent keeps results.
    compiler = _core.GrammarCompiler(info, 1, False, -1, False)
    answer({"ready": True})
    for line in stdin:
        request = json.loads(line)
        try:
            if request.get("kind") == "structural_tag":
                # each schema of the tag compiles as a json_schema format's does
                tag = json.loads(request["schema"])
                for node in tag_schemas(tag):
                    node["grammar"] = json_ebnf(json.dumps(node.pop("json_schema")),
                                                node.pop("strict", False))  # fmt: skip
                    node["type"] = "grammar"
                grammar = _core.Grammar.from_structural_tag(json.dumps(tag))
            else:
                grammar = _core.Grammar.from_json_schema(*json_args(request["schema"],
                                                                    request["strict"]))  # fmt: skip
            ebnf = no_raw_controls(reparseable(str(grammar.to_string())))
            compiled = compiler.compile_grammar_from_strings(ebnf, "root")
            answer({"ok": str(compiled.serialize_json())})
        except Exception as exc:  # xgrammar names the construct it refuses
            answer({"error": (str(exc).strip().splitlines() or ["unknown error"])[0]})


if __name__ == "__main__":
    serve()
