"""An item's result from its route's answer: counts from the metered usage record, or, when
metering failed and left none, from the answer's own usage in each endpoint's shape."""

import json

import pytest

from serving.api.batch.items import answer_result
from serving.usage.record import UsageRecord

ANSWERS = {
    "chat / completions": {"usage": {"prompt_tokens": 7, "completion_tokens": 3,
                                     "prompt_tokens_details": {"cached_tokens": 4}}},
    "responses": {"usage": {"input_tokens": 7, "output_tokens": 3,
                            "input_tokens_details": {"cached_tokens": 4}}},
    "workers ai": {"result": {"response": "x", "usage": {"prompt_tokens": 7,
                                                         "completion_tokens": 3,
                                                         "cached_tokens": 4}}},
}  # fmt: skip


@pytest.mark.parametrize("shape", sorted(ANSWERS))
def test_counts_come_from_the_answer_when_no_record_was_metered(shape):
    result = answer_result(200, json.dumps(ANSWERS[shape]).encode(), None)
    assert result.ok and (result.prompt_tokens, result.completion_tokens,
                          result.cached_tokens) == (7, 3, 4)  # fmt: skip


@pytest.mark.parametrize("shape", sorted(ANSWERS))
def test_a_metered_record_gives_the_counts_whatever_the_answer_says(shape):
    record = UsageRecord("acme", "k", "base", "batch", 11, 5, 2, 0.0)
    result = answer_result(200, json.dumps(ANSWERS[shape]).encode(), record)
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (11, 2, 5)
    assert result.usage is record
