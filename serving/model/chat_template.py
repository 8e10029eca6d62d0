"""Chat templates: turn a list of messages into the prompt text a chat model was trained on.

Templates are Jinja2 programs shipped with the model (chat_template.jinja, or the
`chat_template` of tokenizer_config.json), so they are untrusted code: they run in Jinja's
immutable sandbox. The environment copies transformers' (`render_jinja_template`) so that a
prompt rendered here is the prompt rendered there: trim_blocks, lstrip_blocks, loop controls,
`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII, and the special tokens
(`bos_token`, `eos_token`, ...) as variables. `{% generation %}` blocks, which only mark
assistant text for training masks, render their body unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from serving.model.errors import ChatTemplateError

# names under which a message's reasoning arrives; templates read the first
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: render the body as is."""

    tags = frozenset({"generation"})

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's namespace() without underscore names, which could reach Python internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


class _Dict:
    """dict() and dict.fromkeys() for templates, without the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict:
        return dict.fromkeys(*args)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=16)
def compile_chat_template(source: str) -> jinja2.Template:
    """The template compiled in the sandbox; jinja2.TemplateSyntaxError if it does not parse."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["namespace"] = _Namespace
    env.globals["dict"] = _Dict()
    return env.from_string(source)


def render_chat_template(
    source: str,
    messages: list[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    **template_kwargs: Any,
) -> str:
    """The prompt text for `messages`; ChatTemplateError if the template refuses them.

    special_tokens ({"bos_token": "<s>", ...}) and template_kwargs (e.g. enable_thinking)
    become template variables; template_kwargs win on a clash, as in transformers.
    """
    if not messages:
        raise ChatTemplateError("chat template: the conversation is empty")
    chat = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise ChatTemplateError(f"chat template: a message must be an object, got {message!r}")
        chat.append(_alias_reasoning({k: _plain(v) for k, v in message.items() if v is not None}))
    variables = {**(special_tokens or {}), **_plain(template_kwargs)}
    try:
        return compile_chat_template(source).render(
            messages=chat,
            tools=_plain(tools),
            documents=_plain(documents),
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template: {exc}") from None


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    # a message's reasoning is offered under the names templates read, as transformers does
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _plain(value: Any) -> Any:
    """A copy made of JSON types only, so the template sees no object with methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    for base in (bool, int, float, str):  # subclasses (enums, numpy scalars) lose their methods
        if isinstance(value, base):
            return base(value)
    return f"<{type(value).__name__}>"
