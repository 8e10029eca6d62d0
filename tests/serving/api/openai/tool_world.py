"""Worlds whose chat templates offer tools: in the Hermes and Qwen spelling, and in Mistral's."""

from __future__ import annotations

from pathlib import Path

import tokenizers

from serving.model.tokenizer import load_tokenizer
from tests.serving.engine.world import World, build_world

HERMES_TEMPLATE = (
    "{%- if tools %}<|system|>Tools:{% for t in tools %}\n{{ t.function | tojson }}{% endfor %}"
    "</s>{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|assistant|>"
    "{%- for c in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}</s>"
    "{%- elif m.role == 'tool' %}<|user|><tool_response>{{ m.content }}</tool_response></s>"
    "{%- else %}<|{{ m.role }}|>{{ m.content }}</s>{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tool_world(root: Path) -> World:
    """build_world's model and adapters, its tokenizer given HERMES_TEMPLATE."""
    world = build_world(root)
    (world.base_dir / "chat_template.jinja").write_text(HERMES_TEMPLATE)
    world.tokenizer = load_tokenizer(world.base_dir)
    return world


MARKER = "[TOOL_CALLS]"
# Mistral 7B v0.3's spelling, shortened: tools before the last user turn, calls as one list
# after the [TOOL_CALLS] special token, each with a 9-character id the template insists on
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'user' %}"
    "{% if loop.last and tools %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]"
    "{% endif %}[INST] {{ m.content }}[/INST]"
    "{% elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS] ["
    "{% for c in m.tool_calls %}"
    "{% if c.id is not defined or c.id | length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{% endif %}"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}, '
    '"id": "{{ c.id }}"}{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}'
    "{% elif m.role == 'tool' %}"
    '[TOOL_RESULTS] {"content": {{ m.content | tojson }}, "call_id": "{{ m.tool_call_id }}"}'
    "[/TOOL_RESULTS]"
    "{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"
)


def mistral_world(root: Path) -> World:
    """build_world's model and adapters, its tokenizer given Mistral's [TOOL_CALLS] special
    token (an id the model embeds) and MISTRAL_TEMPLATE."""
    world = build_world(root)
    path = world.base_dir / "tokenizer.json"
    backend = tokenizers.Tokenizer.from_file(str(path))
    backend.add_special_tokens([tokenizers.AddedToken(MARKER, special=True)])
    backend.save(str(path))
    (world.base_dir / "chat_template.jinja").write_text(MISTRAL_TEMPLATE)
    world.tokenizer = load_tokenizer(world.base_dir)
    return world
