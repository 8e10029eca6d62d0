"""The grammar's parts, against xgrammar's own matchers and hand-written EBNF.

no_raw_controls must take control characters out of every negated class and touch nothing
else (literals, positive classes, escapes); the engine's compiled grammars then refuse a raw
control character in a bound string, which a strict JSON parser would refuse too.
RowGrammar.fill_along and valid_prefix advance along drafts and roll back: the masks they
fill are those of fresh matchers fed each prefix, and the state afterwards is as before.
"""

import json

import pytest
import xgrammar

from serving.engine.grammar.compiler import no_raw_controls, reparseable
from serving.engine.grammar.matcher import RowGrammar
from serving.model.tokenizer import load_tokenizer
from tests.serving.engine.test_structured import CHOICE_TEXTS, CHOICES, compiled, fmt
from tests.serving.engine.world import FIELDS
from tests.serving.model.hf_folders import save_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("grammar")
    save_tokenizer(folder, "byte_level_bpe")  # the engine world's tokenizer
    return load_tokenizer(folder)


@pytest.mark.parametrize(
    ("ebnf", "want"),
    [
        (r'c ::= [^"\\\r\n]', r'c ::= [^\0-\u001f"\\\r\n]'),  # a bound string's characters
        (r"c ::= [a-z] [^a]", r"c ::= [a-z] [^\0-\u001fa]"),  # a positive class is left alone
        (r'c ::= "[^x]" [^x]', r'c ::= "[^x]" [^\0-\u001fx]'),  # so is a literal's text
        (r'c ::= "\"[^" [^x]', r'c ::= "\"[^" [^\0-\u001fx]'),  # an escaped quote ends nothing
        (r'c ::= [^\]"] "[^"', r'c ::= [^\0-\u001f\]"] "[^"'),  # nor does a quote in a class
        (r'c ::= [^\0-\u001f"]', r'c ::= [^\0-\u001f"]'),  # already without controls
    ],
)
def test_no_raw_controls_edits_only_negated_classes(ebnf, want):
    assert no_raw_controls(ebnf) == want
    assert no_raw_controls(want) == want


def test_a_negated_class_opening_with_a_hex_digit_keeps_its_meaning():
    ebnf = no_raw_controls("root ::= [^a]+")  # not [^\0-\x1fa]: read as [^\0-\u01fa]
    accepts = xgrammar.testing._is_grammar_accept_string
    assert accepts(ebnf, "bcd") and not accepts(ebnf, "a") and not accepts(ebnf, "b\x01")


def test_reparseable_spells_byte_escapes_as_unicode_ones():
    assert reparseable(r'c ::= "\xefc" [\xe0-\xffa]') == r'c ::= "\u00efc" [\u00e0-\u00ffa]'
    assert reparseable(r'c ::= "\\xefc" "\"" "\x4"') == r'c ::= "\\xefc" "\"" "\x4"'


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        ({"const": "ïc"}, ['"ïc"'], ['"\u0efc"', '"໼"']),  # U+00EF, then a hex digit
        ({"enum": ["Größe", "über"]}, ['"Größe"', '"über"'], ['"Grö෾"']),
        ({"type": "string", "pattern": "^[^a]+$"}, ['"bcd"', '"zz"'], ['"bad"']),
        ({"type": "string", "pattern": "^[^0-9]+$"}, ['"abc"'], ['"a1"']),
        ({"type": "string", "pattern": "^[à-ÿa]+$"}, ['"àa"', '"ÿ"'], ['"b"', '"࿺"']),
    ],
)
def test_latin1_literals_and_negated_classes_mean_what_the_schema_says(
    tokenizer, schema, good, bad
):
    """Literals with U+0080..U+00FF before a hex digit, and negated classes that begin with
    one, accept exactly the schema's strings through the engine's compiled grammar."""
    grammar = compiled(tokenizer, fmt(schema))
    for text in good + bad:
        assert xgrammar.GrammarMatcher(grammar).accept_string(text) == (text in good), text


def test_bound_strings_refuse_raw_control_characters(tokenizer):
    schema = fmt({"type": "string", "maxLength": 5})
    raw = '"a\x01b"'
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)  # what a strict parser makes of a raw one
    ebnf = str(xgrammar.Grammar.from_json_schema(schema.schema, any_whitespace=False))
    assert xgrammar.testing._is_grammar_accept_string(ebnf, raw)  # xgrammar's own rule lets it in
    assert not xgrammar.testing._is_grammar_accept_string(no_raw_controls(ebnf), raw)
    for text, ok in [(raw, False), ('"a\tb"', False), ('"a b"', True)]:
        assert xgrammar.GrammarMatcher(compiled(tokenizer, schema)).accept_string(text) == ok, text


def reference_masks(grammar, prefixes: list[list[int]]):
    """The bitmask after each token prefix, from fresh matchers."""
    bitmask = xgrammar.allocate_token_bitmask(len(prefixes), FIELDS["vocab_size"])
    for row, prefix in enumerate(prefixes):
        matcher = xgrammar.GrammarMatcher(grammar)
        assert all(matcher.accept_token(t) for t in prefix)
        matcher.fill_next_token_bitmask(bitmask, row)
    return bitmask


def test_fill_along_and_valid_prefix_leave_the_state_as_it_was(tokenizer):
    grammar = compiled(tokenizer, fmt(CHOICES))
    tokens = tokenizer.encode(CHOICE_TEXTS[4], add_special_tokens=False)
    refused = tokenizer.encode("x", add_special_tokens=False)[0]
    row = RowGrammar(grammar)
    row.accept(tokens[0])  # one committed token; the rest are drafts
    before = row.allocate(1)
    row.fill(before, 0)

    drafts = [*tokens[1:4], refused, *tokens[5:7]]
    assert row.valid_prefix(tokens[1:]) == len(tokens) - 1
    assert row.valid_prefix(drafts) == 3
    bitmask = row.allocate(9)
    bitmask[:2] = 0  # rows before `first` must stay untouched
    assert row.fill_along(drafts, bitmask, 2) == 3
    want = reference_masks(grammar, [tokens[:j] for j in range(1, 5)])
    assert (bitmask[:2] == 0).all()
    assert (bitmask[2:6] == want).all()  # after the committed token, then each kept draft
    assert (bitmask[6:] == -1).all()  # past the refused draft: unused, every token allowed

    after = row.allocate(1)
    row.fill(after, 0)
    assert (after == before).all() and (before == want[0]).all()
    assert not row.accept(tokens[2]) and row.accept(tokens[1])  # still right after tokens[0]
    for t in [*tokens[2:], tokenizer.eos_token_ids[0]]:
        assert row.accept(t)
    assert row.terminated and not row.accept(tokens[0])


OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    ("schema", "text", "ended"),
    [
        ({"type": "integer"}, "1", False),  # whole, but 12 or 1.5 may still come
        (OBJECT, '{"a": 1}', True),
        (OBJECT, '{"a": 1', False),
        ({"enum": ["x", "y"]}, '"x"', True),
    ],
)
def test_ended_only_when_nothing_but_a_stop_may_follow(tokenizer, schema, text, ended):
    """What decides a max_tokens cut's finish reason: 'stop' only on a value nothing extends."""
    row = RowGrammar(compiled(tokenizer, fmt(schema)))
    assert all(row.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))
    assert row.ended == ended
