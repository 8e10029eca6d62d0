"""Chat templates rendered here and by transformers' apply_chat_template: the same text."""

import json

import pytest
from transformers import AutoTokenizer

from serving.model.errors import ChatTemplateError, ModelLoadError
from serving.model.tokenizer import load_tokenizer
from tests.serving.model.hf_folders import save_tokenizer

SIMPLE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Llama 3 style: system message split off, tools as JSON, a date from strftime_now
LLAMA3 = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}
{%- else %}{%- set system = "" %}{%- endif %}
{{- "<|system|>\\nToday: " + strftime_now("%Y") + "\\n" + system }}
{%- if tools is not none %}{{- "\\nTools:\\n" }}
    {%- for t in tools %}{{ t | tojson(indent=2) }}{% endfor %}
{%- endif %}
{{- eos_token }}
{%- for message in messages %}
    {{- "<|" + message['role'] + "|>\\n" + message['content'] | trim + eos_token }}
    {%- if message.tool_calls is defined %}{{ message.tool_calls | tojson }}{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- "<|assistant|>\\n" }}{%- endif %}"""
# Mistral style: roles must alternate (raise_exception), namespace, loop controls,
# a {% generation %} block, and reasoning read under 'reasoning_content'
MISTRAL = """{%- set ns = namespace(count=0) %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}{% continue %}{% endif %}
    {%- if (message['role'] == 'user') != (ns.count % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}
    {%- endif %}
    {%- set ns.count = ns.count + 1 %}
    {%- if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}
    {%- else %}{% generation %}{{ message.get('reasoning_content', '') }}
        {{- message['content'] + eos_token }}{% endgeneration %}
    {%- endif %}
    {%- if ns.count > 6 %}{% break %}{% endif %}
{%- endfor %}"""
TEMPLATES = {"simple": SIMPLE, "llama3": LLAMA3, "mistral": MISTRAL}

CHATS = [
    [{"role": "user", "content": "Bonjour, ça va ? 日本語 😀"}],
    [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "def f():\n    return 1"},
        {"role": "assistant", "content": "OK.", "reasoning_content": "thinking…"},
        {"role": "user", "content": "and \"quotes\" <html>?", "name": None},
    ],
    [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function",
                         "function": {"name": "w", "arguments": {"c": "Zürich"}}}]},
    ],
]  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "w", "description": "météo",
                                           "parameters": {"type": "object"}}}]  # fmt: skip


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    save_tokenizer(folder, "byte_level_bpe", chat_template=TEMPLATES[request.param])
    return load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("chat", range(len(CHATS)))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rendering_matches_transformers(pair, chat, add_generation_prompt):
    ours, ref = pair
    messages = CHATS[chat]
    for kwargs in ({}, {"tools": TOOLS}):
        expected = ref.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )
        got = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                       **kwargs)  # fmt: skip
        assert got == expected
        # and the prompt encodes to the ids transformers' tokenized template gives
        ids = ref.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                      return_dict=False, **kwargs)  # fmt: skip
        assert ours.encode(got, add_special_tokens=False) == ids


def test_raise_exception_becomes_a_clear_error(tmp_path):
    save_tokenizer(tmp_path, "byte_level_bpe", chat_template=MISTRAL)
    ours, ref = load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    bad = [{"role": "assistant", "content": "first"}]
    with pytest.raises(Exception, match="roles must alternate"):
        ref.apply_chat_template(bad, tokenize=False)
    with pytest.raises(
        ChatTemplateError, match=r"^chat template: Conversation roles must alternate"
    ):
        ours.apply_chat_template(bad)
    with pytest.raises(ChatTemplateError, match="empty"):
        ours.apply_chat_template([])
    with pytest.raises(ChatTemplateError, match="must be an object"):
        ours.apply_chat_template(["hi"])


def test_the_sandbox_holds(tmp_path):
    escape = "{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}"
    save_tokenizer(tmp_path, "byte_level_bpe", chat_template=escape)
    with pytest.raises(ChatTemplateError):
        load_tokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])
    sneaky = "{% set ns = namespace() %}{% set ns._x = 1 %}{{ ns._x }}"
    (tmp_path / "chat_template.jinja").write_text(sneaky)
    with pytest.raises(ChatTemplateError, match="not allowed"):
        load_tokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])


def test_template_sources(tmp_path):
    save_tokenizer(tmp_path, "byte_level_bpe")
    msg = [{"role": "user", "content": "hi"}]
    with pytest.raises(ChatTemplateError, match="no chat template"):
        load_tokenizer(tmp_path).apply_chat_template(msg)
    # transformers 4 kept the template in tokenizer_config.json, sometimes as a named list
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = [
        {"name": "tool_use", "template": "T"},
        {"name": "default", "template": SIMPLE},
    ]
    config_path.write_text(json.dumps(config))
    ours, ref = load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    assert ours.apply_chat_template(msg) == ref.apply_chat_template(
        msg, tokenize=False, add_generation_prompt=True)  # fmt: skip
    # chat_template.jinja, what transformers 5 writes, wins over the config
    (tmp_path / "chat_template.jinja").write_text("J{{ messages[0]['content'] }}")
    assert load_tokenizer(tmp_path).apply_chat_template(msg) == "Jhi"
    (tmp_path / "chat_template.jinja").write_text("{% for %}")
    with pytest.raises(ModelLoadError, match="chat template does not parse"):
        load_tokenizer(tmp_path)
