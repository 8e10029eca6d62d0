"""A world whose chat template offers tools and writes calls as Hermes and Qwen do."""

from __future__ import annotations

from pathlib import Path

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
