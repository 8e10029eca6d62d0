"""rank_pattern and alpha_pattern keys pick a module as PEFT's rule does, `(.*\\.)?(key)$`
with the first matching key winning, and a tenant's pattern cannot hold a thread for long:
matching is bounded in time, where `re` backtracks for hours on (.|.){30}Q."""

import re
import threading

import pytest

from adapters.errors import AdapterError
from adapters.format import peft_config
from adapters.format.adapter import parse_adapter
from adapters.format.peft_config import LoraConfig
from tests.adapters.factory import TINY_SPEC
from tests.adapters.malformed import with_config

NAMES = [
    "base_model.model.model.layers.0.self_attn.q_proj",
    "base_model.model.model.layers.10.self_attn.q_proj",
    "base_model.model.model.layers.1.mlp.down_proj",
    "base_model.model.model.layers.11.mlp.up_proj",
    "q_proj",
]
KEYS = [
    "layers.1.mlp.down_proj",  # dots are regex wildcards, as in PEFT
    "model.layers.1[0-9].*",
    "q_proj",
    "up_proj",
    r"layers\.0\..*",
    "layers_1.mlp.up_proj",
    "proj",  # a whole component only: matches no name
]


def peft_rule(keys, name):
    return next((k for k in keys if re.match(rf"(.*\.)?({k})$", name)), None)


@pytest.mark.parametrize("order", [KEYS, KEYS[::-1], KEYS[2:] + KEYS[:2]])
def test_the_first_key_that_matches_wins_as_in_peft(order):
    config = LoraConfig(rank=8, alpha=8, rank_pattern={k: i + 1 for i, k in enumerate(order)})
    for name in NAMES:
        want = peft_rule(order, name)
        assert config.rank_of(name) == (order.index(want) + 1 if want else 8), name


def test_a_backtracking_pattern_is_matched_promptly():
    files = with_config(rank_pattern={"(.|.){30}Q": 4}, alpha_pattern={"(a|aa)*b": 2})
    done: list = []
    thread = threading.Thread(target=lambda: done.append(parse_adapter(files, base=TINY_SPEC)),
                              daemon=True)  # fmt: skip
    thread.start()
    thread.join(timeout=30)  # `re` would take hours; a hang fails here instead of stalling
    assert done, "matching the patterns did not end"
    assert {m.a.shape[0] for m in done[0].modules.values()} == {8}  # no module matched


def test_matching_past_the_budget_is_refused_with_a_clear_message(monkeypatch):
    monkeypatch.setattr(peft_config, "MATCH_BUDGET_S", 0.0)
    with pytest.raises(AdapterError, match=r"rank_pattern: matching the model's module names "
                                           r"took over 0 s \(pattern 'q_pr.j'\)"):  # fmt: skip
        parse_adapter(with_config(rank_pattern={"q_pr.j": 4}), base=TINY_SPEC)
    # A plain module name needs no regex, and no budget.
    parse_adapter(with_config(rank_pattern={"q_proj": 8}), base=TINY_SPEC)
