"""A byte-level BPE for Python source, with the chat template the demo serves."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from serving.model.chat_template import render_chat_template  # the server's sandbox

EOS = "<|endoftext|>"  # ends a document; the pad token too
END = "<|end|>"  # ends a chat turn
ROLES = ("system", "user", "assistant")
SPECIALS = (EOS, END, *(f"<|{r}|>" for r in ROLES))
# One turn per message, each closed by <|end|>; the model answers after <|assistant|>. With
# tools, a system turn first lists them and says how a call is written (Hermes' <tool_call>
# spelling); a tool's answer comes back as a user turn in <tool_response>. A chat without
# tools renders exactly as before tools were added.
CHAT_TEMPLATE = (
    "{% if tools %}<|system|>\nYou may call these functions. To call one, answer with\n"
    '<tool_call>\n{"name": <its name>, "arguments": <its arguments>}\n</tool_call>\n'
    "{% for tool in tools %}{{ tool['function'] | tojson }}\n{% endfor %}<|end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('roles are system, user, assistant and tool') }}{% endif %}"
    "{% if message['role'] == 'tool' %}"
    "<|user|>\n<tool_response>\n{{ message['content'] }}\n</tool_response><|end|>\n"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}<|assistant|>\n"
    "{% for call in message['tool_calls'] %}{% if not loop.first %}{{ '\\n' }}{% endif %}"
    '<tool_call>\n{"name": "{{ call[\'function\'][\'name\'] }}", "arguments": '
    "{{ call['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}<|end|>\n"
    "{% else %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of vocab_size ids (specials first) trained on texts."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def render_chat(
    messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None
) -> str:
    """The chat template's text for messages (and tools), as the server renders it."""
    return render_chat_template(
        CHAT_TEMPLATE, messages, add_generation_prompt=add_generation_prompt, tools=tools
    )


def save_tokenizer(tok: Tokenizer, out: Path, max_len: int) -> None:
    """tokenizer.json, tokenizer_config.json (with the chat template) and the stop ids."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "additional_special_tokens": [t for t in SPECIALS if t != EOS],
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def stop_ids(tok: Tokenizer) -> list[int]:
    """Ids that end generation: the end of a document and the end of a turn."""
    return [tok.token_to_id(EOS), tok.token_to_id(END)]
