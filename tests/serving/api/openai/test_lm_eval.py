"""lm-evaluation-harness's `local-completions` model against a live server: a multiple-choice
task from a local YAML file and JSONL data (no hub), the adapter chosen by `model`. Each
choice's log-likelihood (echo, logprobs, max_tokens 1, as lm-eval sends them) must equal
transformers + PEFT scoring the same token ids under that adapter."""

import json

import pytest
import torch

from tests.serving.api.served import ACME

lm_eval = pytest.importorskip("lm_eval")

TOL = 1e-4 * 8  # a sum of up to ~8 continuation tokens, each within 1e-4
ITEMS = [
    {"question": "What colour is the sky?", "choices": ["blue", "green", "loud"], "label": 0},
    {"question": "How many legs has a cat?", "choices": ["two", "four"], "label": 1},
    {"question": "Which is a fruit?", "choices": ["a chair", "an apple", "the sea"], "label": 1},
]
TASK = """\
task: tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
  cache_dir: {cache}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: choices
doc_to_target: label
target_delimiter: " "
metric_list:
  - metric: acc
"""


def continuation_logprob(world, context: list[int], continuation: list[int], name: str) -> float:
    """log p(continuation | context) under adapter name, by transformers + PEFT (float64)."""
    ids = context + continuation
    world.peft.set_adapter(name)
    with torch.no_grad():
        logits = world.peft(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return sum(float(lp[p - 1, ids[p]]) for p in range(len(context), len(ids)))


def test_local_completions_loglikelihoods_equal_peft(served, tmp_path, monkeypatch):
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("OPENAI_API_KEY", ACME)  # local-completions' bearer token
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "tiny_choice.yaml").write_text(TASK.format(data=data, cache=tmp_path / "hf"))

    lm = LocalCompletionsAPI(
        base_url=f"{served.url}/v1/completions",
        model="upper",  # the adapter: as a client names it
        tokenizer=str(served.world.base_dir),  # the model folder's tokenizer: no hub
        tokenizer_backend="huggingface",
        max_length=served.settings.max_model_len,
        max_retries=1,
    )
    results = simple_evaluate(
        model=lm,
        tasks=["tiny_choice"],
        task_manager=TaskManager(include_path=str(tasks)),
        log_samples=True,
        cache_requests=False,
    )
    samples = results["samples"]["tiny_choice"]
    assert len(samples) == len(ITEMS)
    checked = 0
    for sample in samples:
        for args, resp in zip(sample["arguments"], sample["resps"], strict=True):
            context, continuation = _pair(args)
            ctx_ids, cont_ids = lm._encode_pair(context, continuation)
            want = continuation_logprob(served.world, ctx_ids, cont_ids, "upper")
            assert resp[0][0] == pytest.approx(want, abs=TOL), (context, continuation)
            checked += 1
    assert checked == sum(len(item["choices"]) for item in ITEMS)
    assert 0.0 <= results["results"]["tiny_choice"]["acc,none"] <= 1.0


def _pair(args) -> tuple[str, str]:
    """(context, continuation) of one logged request, however the version logs them."""
    if isinstance(args, dict):
        return args["arg_0"], args["arg_1"]
    return args[0], args[1]
