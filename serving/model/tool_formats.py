"""How a model family writes a tool call, and the constraint that holds it to that syntax.

Each family's text comes from one ToolFormat: the chat route parses a model's output by it
(tool_parse.py) and constrains generation by it (structural_tag), so the two never disagree.

| family | one call, as the model writes it | calls apart |
| --- | --- | --- |
| `hermes` (Hermes, Qwen 2.5 and 3) | `<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>` | a newline |
| `llama3_json` (Llama 3.1, 3.2, 3.3) | `{"name": "f", "parameters": {...}}` | `; ` |
| `mistral` (Mistral 7B v0.3, Mixtral 8x22B, Mistral Nemo) | `[TOOL_CALLS] [{"name": "f", "arguments": {...}}]`, the calls in one list | `, ` |

The family is read from the chat template (`detect`), or set by `model.tool_call_format`
where the template does not say. `[TOOL_CALLS]` is a special token: the tokenizer keeps it
in output text (MARKERS), and the grammar may emit it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CONFIG_KEY = "model.tool_call_format"
# Special tokens that are part of a call's spelling: kept in decoded text and in the
# grammar's vocabulary, where other special tokens are left out of both
MARKERS = ("[TOOL_CALLS]",)


@dataclass(frozen=True)
class ToolFormat:
    """One family's syntax: a call is `head` name `", "<args_key>": ` arguments `end`."""

    name: str
    trigger: str  # the text that opens a call: under tool_choice auto the constraint starts here
    head: str  # a call's text before the function's name
    args_key: str  # the key of the arguments object
    end: str  # a call's text after its arguments
    separator: str  # between two calls
    opening: str = ""  # when the calls sit in one list: the text that opens it
    closing: str = ""  # and that closes it
    id_length: int | None = None  # its template's rule for call ids; None: OpenAI's

    def begin(self, function: str) -> str:
        """A call's text up to its arguments."""
        return f'{self.head}{function}", "{self.args_key}": '


HERMES = ToolFormat(
    "hermes", "<tool_call>", '<tool_call>\n{"name": "', "arguments", "}\n</tool_call>", "\n"
)
LLAMA3_JSON = ToolFormat("llama3_json", '{"name": ', '{"name": "', "parameters", "}", "; ")
# its templates refuse a call id that is not 9 letters and digits
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", '{"name": "', "arguments", "}", ", ",
                     opening="[TOOL_CALLS] [", closing="]", id_length=9)  # fmt: skip
FORMATS = {f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL)}


def detect(template: str | None) -> ToolFormat | None:
    """The family a chat template writes tool calls in; None when it names none."""
    if not template or "tools" not in template:
        return None
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<tool_call>" in template:
        return HERMES
    if '"parameters"' in template or "<|python_tag|>" in template:
        return LLAMA3_JSON
    return None


def structural_tag(
    fmt: ToolFormat, tools: Sequence[tuple[str, dict, bool]], choice: str, parallel: bool
) -> dict:
    """xgrammar's structural tag for output under tool_choice: "auto" (free text; a call once
    the model writes the trigger), "required" (calls only), or a function's name (that call
    alone). tools: (name, parameters schema, strict) of the functions the output may call;
    each schema is a {"type": "json_schema"} node, compiled as a response_format's is."""
    tags = [
        {"type": "tag", "begin": fmt.begin(name),
         "content": {"type": "json_schema", "json_schema": schema, "strict": strict},
         "end": fmt.end}
        for name, schema, strict in tools
    ]  # fmt: skip
    if choice not in ("auto", "required"):
        tags = [t for t, (name, _, _) in zip(tags, tools, strict=True) if name == choice]
    one = choice not in ("auto", "required") or not parallel
    if fmt.opening:  # the calls sit in one list, opened once
        calls = {"type": "tags_with_separator", "tags": tags, "separator": fmt.separator,
                 "at_least_one": True, "stop_after_first": one}  # fmt: skip
        tags = [{"type": "tag", "begin": fmt.opening, "content": calls, "end": fmt.closing}]
        one = True
    if choice == "auto":
        body = {"type": "triggered_tags", "triggers": [fmt.trigger], "tags": tags,
                "at_least_one": False, "stop_after_first": one}  # fmt: skip
    else:
        body = {"type": "tags_with_separator", "tags": tags, "separator": fmt.separator,
                "at_least_one": True, "stop_after_first": one}  # fmt: skip
    return {"type": "structural_tag", "format": body}
