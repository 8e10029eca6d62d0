"""Constrained decoding end to end: every finished output is JSON that its schema accepts.

The oracles are independent of the engine's grammar code: `json.loads` (strict: no raw
control characters) and `jsonschema.validate` for complete outputs; for cut ones, the list of
every complete output a small enum schema allows, and a fresh xgrammar matcher. A mixed batch
(adapters, base-only, greedy and seeded rows, staggered arrivals) also shows the masks touch
only their own rows: free rows get exactly the tokens they get in a batch with no grammar.
How compiles fail and wait, each request alone: test_structured_compiles.py.
"""

import itertools
import json
import time

import jsonschema
import pytest
import xgrammar

from serving.engine.grammar.compiler import GrammarCompiler
from serving.engine.request import GenerateRequest, ResponseFormat, SamplingParams
from tests.serving.engine.world import FIELDS, build_world

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "active"],
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "active": {"type": "boolean"}}}  # fmt: skip
COLORS, SIZES = ["red", "green", "blue"], ["small", "large", 3, None]
CHOICES = {"type": "object", "additionalProperties": False, "required": ["color", "size"],
           "properties": {"color": {"enum": COLORS}, "size": {"enum": SIZES}}}  # fmt: skip
LINE = {"type": "object", "additionalProperties": False, "required": ["sku", "qty"],
        "properties": {"sku": {"type": "string", "maxLength": 4},
                       "qty": {"type": "integer", "minimum": 1, "maximum": 9}}}  # fmt: skip
ORDER = {"type": "object", "additionalProperties": False, "required": ["items", "meta"],
         "properties": {"items": {"type": "array", "items": LINE, "minItems": 1, "maxItems": 2},
                        "meta": {"type": "object", "additionalProperties": False,
                                 "required": ["rush"],
                                 "properties": {"rush": {"type": "boolean"}}}}}  # fmt: skip
SCHEMAS = [PERSON, CHOICES, ORDER]  # bounded strings and numbers: their outputs terminate
# CHOICES prints its keys in schema order: every complete output, for checking cut ones
CHOICE_TEXTS = [f'{{"color": "{c}", "size": {json.dumps(s)}}}' for c, s in itertools.product(COLORS, SIZES)]  # fmt: skip


def fmt(schema: dict) -> ResponseFormat:
    return ResponseFormat("json_schema", json.dumps(schema, sort_keys=True, separators=(",", ":")), strict=True)  # fmt: skip


JSON_OBJECT = ResponseFormat("json_object")
FORMATS = [(fmt(s), s) for s in SCHEMAS] + [(JSON_OBJECT, {"type": "object"})]


def compiled(tokenizer, f: ResponseFormat):
    """f compiled by a compiler of its own (not the engine's), for the world's vocabulary."""
    compiler = GrammarCompiler(tokenizer, FIELDS["vocab_size"], workers=1)
    try:
        return compiler.compile_now(f)
    finally:
        compiler.shutdown()  # its process ends; the grammar read back stays usable


class Run:
    """Collects each request's tokens and its last output, and the steps it got tokens in."""

    def __init__(self, engine):
        self.engine, self.step = engine, 0
        self.tokens, self.done, self.steps = {}, {}, {}

    def sink(self, out):
        self.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        if out.new_token_ids:
            self.steps.setdefault(out.request_id, set()).add(self.step)
        if out.finished:
            self.done[out.request_id] = out

    def advance(self, max_steps: int = 20_000, until=lambda: False) -> None:
        """Step until idle or until(), as run_until_idle does: compiles and loads are waited for."""
        for _ in range(max_steps):
            if until():
                return
            stepped = self.engine.step()
            if not stepped and not self.engine.grammars:
                return
            self.step += stepped
            if not self.engine.scheduler.running:  # only compiles or adapter loads pending
                time.sleep(0.001)
        raise AssertionError("the engine did not go idle")

    def text(self, request_id: str, tokenizer) -> str:
        return tokenizer.decode(self.tokens.get(request_id, []))


def run(engine, requests) -> Run:
    got = Run(engine)
    for i, request in enumerate(requests):
        engine.submit(request, got.sink)
        if i % 3 == 2:  # arrivals staggered across steps
            for _ in range(2):
                got.step += engine.step()
    got.advance()
    return got


def req(world, request_id, prompt, sampling, name=None, f=None) -> GenerateRequest:
    """name: an adapter of the world, or None (base-only); f: the response format, if any."""
    return GenerateRequest(request_id, tuple(prompt), sampling, world.versions.get(name), response_format=f)  # fmt: skip


def params(i: int, max_tokens: int = 160, **kw) -> SamplingParams:
    """Greedy for even i, seeded sampling for odd i."""
    if i % 2 == 0:
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, top_p=0.95, seed=i, **kw)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("structured"))


@pytest.fixture(scope="module")
def mixed(world):
    """8 constrained rows (4 formats x greedy/sampled) and 4 free ones, staggered."""
    names = ["upper", "rot13", "mlp", None, "upper", None]
    constrained = [
        req(world, f"c{i}", range(20 + i, 31 + 2 * i), params(i), names[i % 6], f)
        for i, (f, _) in enumerate(FORMATS * 2)
    ]
    free = [
        req(world, f"f{i}", range(40 + i, 50 + i), params(i, 24, ignore_eos=True), names[i + 1])
        for i in range(4)
    ]
    requests = [r for pair in itertools.zip_longest(constrained, free) for r in pair if r]
    engine = world.engine()
    try:
        for f, _ in FORMATS:  # compiled before the first step, so free rows share steps with them
            engine.grammars.compiler.compile_now(f)
        return constrained, free, run(engine, requests)
    finally:
        engine.shutdown()


def test_constrained_outputs_parse_and_validate(world, mixed):
    constrained, _, got = mixed
    schema_of = {f: s for f, s in FORMATS}
    for r in constrained:
        done, text = got.done[r.request_id], got.text(r.request_id, world.tokenizer)
        if r.response_format is JSON_OBJECT and done.finish_reason == "length":
            # free keys and strings need not end: what came is still a prefix of an object
            matcher = xgrammar.GrammarMatcher(compiled(world.tokenizer, JSON_OBJECT))
            assert matcher.accept_string(text), text
            continue
        assert done.finish_reason == "stop", (r.request_id, text)
        jsonschema.validate(json.loads(text), schema_of[r.response_format])
        assert len(got.tokens[r.request_id]) < r.sampling.max_tokens
    # Adapters and seeds really changed the outputs (the enum format has 12 values: two of
    # its sampled rows may agree by chance, as c1 and c5 do with these seeds).
    outputs = {got.text(r.request_id, world.tokenizer) for r in constrained}
    assert len(outputs) >= len(constrained) - 1


def test_free_rows_are_untouched_by_constrained_rows(world, mixed, engines):
    constrained, free, got = mixed
    alone = run(engines(), free)
    shared = set().union(*(got.steps[r.request_id] for r in constrained))
    for r in free:
        assert got.tokens[r.request_id] == alone.tokens[r.request_id], r.request_id
        assert len(got.tokens[r.request_id]) == 24
        # most of its steps also sampled constrained rows: the batch really was mixed
        assert len(got.steps[r.request_id] & shared) > 12, r.request_id


def test_a_cut_output_is_a_prefix_of_valid_json(world, engines):
    requests = [
        req(world, f"l{n}", (7, 8, 9, n), params(n, n), name, fmt(CHOICES))
        for n, name in [(2, None), (5, "upper"), (9, "qk"), (14, None)]
    ]
    got = run(engines(), requests)
    for r in requests:
        text = got.text(r.request_id, world.tokenizer)
        assert got.done[r.request_id].finish_reason == "length"
        assert len(got.tokens[r.request_id]) == r.sampling.max_tokens
        assert any(whole.startswith(text) for whole in CHOICE_TEXTS), text
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
        matcher = xgrammar.GrammarMatcher(compiled(world.tokenizer, fmt(CHOICES)))
        assert matcher.accept_string(text) and not matcher.is_terminated()


def test_max_tokens_ending_on_the_values_last_token_is_a_stop(world, engines):
    """A budget that ends exactly on a whole value stops; one token less is a length cut."""
    whole = run(engines(), [req(world, "w", (7, 8, 9), params(0, 60), None, fmt(CHOICES))])
    stops = set(world.tokenizer.eos_token_ids)
    value = [t for t in whole.tokens["w"] if t not in stops]
    assert whole.done["w"].finish_reason == "stop" and len(value) >= 2
    for n, reason in ((len(value), "stop"), (len(value) - 1, "length")):
        got = run(engines(), [req(world, "c", (7, 8, 9), params(0, n), None, fmt(CHOICES))])
        assert got.tokens["c"] == value[:n] and got.done["c"].finish_reason == reason
        text = got.text("c", world.tokenizer)
        if reason == "stop":
            jsonschema.validate(json.loads(text), CHOICES)


def test_ignore_eos_still_stops_once_the_json_is_complete(world, engines):
    def request(i, ignore_eos):
        sampling = params(i, 120, ignore_eos=ignore_eos)
        return req(world, f"e{i}-{ignore_eos}", (3, 4, 5, i), sampling, "upper", fmt(CHOICES))

    ignoring = [request(i, True) for i in range(3)]
    got = run(engines(), ignoring + [request(i, False) for i in range(3)])
    stops = set(world.tokenizer.eos_token_ids)
    for i, r in enumerate(ignoring):
        done, tokens = got.done[r.request_id], got.tokens[r.request_id]
        assert done.finish_reason == "stop" and tokens[-1] in stops
        assert json.loads(got.text(r.request_id, world.tokenizer))["color"] in COLORS
        assert tokens == got.tokens[f"e{i}-False"]  # what honouring the stop token gives
