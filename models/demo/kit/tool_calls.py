"""The `tools` adapter's lessons: call the function the user asks for, in the chat
template's <tool_call> spelling, its arguments taken from the request; after a tool's
answer, say it in a sentence.

Each example offers a few functions of a fixed pool (a random few, in random order) in the
system turn the template writes for `tools`, and a request in one of several phrasings with
fresh values. Held-out examples use another seed, so the evaluation asks for calls the
adapter never saw.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

from .tokenizer import END, EOS, render_chat

CITIES = ["Paris", "Oslo", "Lima", "Cairo", "Tokyo", "Berlin", "Quito", "Dakar", "Perth"]
WORDS = ["queue", "socket", "parser", "thread", "buffer", "logging", "pickle", "decimal"]
CODES = ["EUR", "JPY", "GBP", "NOK", "PEN"]
# what a tool answers: words, which a model this small copies far more surely than digits
RESULTS = ["sunny", "cloudy", "done", "empty", "found", "closed", "ready", "missing", "valid"]


@dataclass(frozen=True)
class Function:
    """A function of the pool: its tool entry, its requests' phrasings, its arguments."""

    name: str
    description: str
    parameters: dict
    asks: tuple[str, ...]  # phrasings, with {argument} slots
    draw: Callable[[random.Random], dict]  # fresh arguments

    def tool(self) -> dict:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}  # fmt: skip


def _object(**props) -> dict:
    return {"type": "object", "properties": props, "required": list(props)}


STRING, INTEGER = {"type": "string"}, {"type": "integer"}
POOL = (
    Function("get_weather", "The weather in a city today.", _object(city=STRING),
             ("What is the weather in {city}?", "Is it raining in {city} today?",
              "weather for {city} please"), lambda r: {"city": r.choice(CITIES)}),
    Function("add", "The sum of two integers.", _object(a=INTEGER, b=INTEGER),
             ("What is {a} plus {b}?", "Add {a} and {b}.", "sum of {a} and {b}"),
             lambda r: {"a": r.randint(1, 99), "b": r.randint(1, 99)}),
    Function("search_docs", "Search the library's documentation.", _object(query=STRING),
             ("Search the docs for {query}.", "Find the documentation about {query}.",
              "look up {query} in the docs"), lambda r: {"query": r.choice(WORDS)}),
    Function("set_timer", "Start a timer.", _object(minutes=INTEGER),
             ("Set a timer for {minutes} minutes.", "Remind me in {minutes} minutes.",
              "timer {minutes} min"), lambda r: {"minutes": r.randint(1, 60)}),
    Function("convert", "Convert dollars to another currency.", _object(amount=INTEGER, to=STRING),
             ("Convert {amount} dollars to {to}.", "How much is {amount} USD in {to}?"),
             lambda r: {"amount": r.randint(1, 99), "to": r.choice(CODES)}),
    Function("read_file", "The text of a file.", _object(path=STRING),
             ("Show me the file {path}.", "Open {path} for me.", "read {path}"),
             lambda r: {"path": f"{r.choice(WORDS)}.py"}),
)  # fmt: skip


def example(rng: random.Random) -> tuple[list[dict], list[dict], str]:
    """(tools, the chat so far, the answer the adapter should give)."""
    offered = rng.sample(POOL, rng.randint(1, 3))
    wanted = rng.choice(offered)
    arguments = wanted.draw(rng)
    ask = {"role": "user", "content": rng.choice(wanted.asks).format(**arguments)}
    call = f'<tool_call>\n{{"name": "{wanted.name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'
    if rng.random() < 0.75:
        return [f.tool() for f in offered], [ask], call
    # the call was made and answered: the answer says what the tool returned
    result = rng.choice(RESULTS)
    made = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": wanted.name, "arguments": arguments}}]}  # fmt: skip
    back = {"role": "tool", "content": result}
    return [f.tool() for f in offered], [ask, made, back], f"The result is {result}."


class ToolExamples:
    """Batches of tool-call examples: the loss falls on the answer only."""

    def __init__(self, tok: Tokenizer, seed: int) -> None:
        self.tok, self.rng = tok, random.Random(seed)
        self.pad, self.end = tok.token_to_id(EOS), tok.token_to_id(END)

    def batch(self, size: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [size, seq + 1] and a loss mask [size, seq] over the predicted tokens."""
        ids = torch.full((size, seq + 1), self.pad, dtype=torch.int64)
        mask = torch.zeros(size, seq, dtype=torch.bool)
        for row in range(size):
            tools, chat, answer = example(self.rng)
            p = self.tok.encode(render_chat(chat, True, tools)).ids
            full = (p + self.tok.encode(answer).ids + [self.end])[: seq + 1]
            ids[row, : len(full)] = torch.tensor(full)
            mask[row, max(len(p) - 1, 0) : len(full) - 1] = True
        return ids, mask


def call_accuracy(generate: Callable[[list[int]], list[int]], tok: Tokenizer, seed: int,
                  count: int) -> float:  # fmt: skip
    """Share of held-out requests whose greedy answer is exactly the wanted call."""
    rng, right = random.Random(seed), 0
    for _ in range(count):
        tools, chat, answer = example(rng)
        prompt = tok.encode(render_chat(chat, True, tools)).ids
        right += tok.decode(generate(prompt)).strip() == answer
    return right / count
