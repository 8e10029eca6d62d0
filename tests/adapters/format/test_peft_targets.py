"""A config that selects fewer modules than its file holds is served as PEFT serves it: PEFT
puts LoRA on the modules target_modules / exclude_modules / layers_to_transform select and
ignores the rest of the file. Reference: the modules PEFT itself loads the adapter into."""

import json
import shutil

import pytest
import torch
from peft import PeftModel

from adapters.errors import AdapterError
from adapters.format.adapter import parse_adapter
from adapters.format.base_model import LINEARS
from adapters.format.sources import read_adapter_files
from tests.adapters.factory import TINY_SPEC
from tests.adapters.peft_models import save_peft_adapter, tiny_llama

SELECTIONS = {
    "a list": {"target_modules": ["q_proj", "down_proj"]},
    "full names": {"target_modules": ["model.layers.1.self_attn.v_proj", "o_proj"]},
    "a regex": {"target_modules": r".*\.layers\.0\..*_proj"},
    "all-linear": {"target_modules": "all-linear"},
    "excluded by list": {"target_modules": list(LINEARS), "exclude_modules": ["k_proj", "up_proj"]},
    "excluded by regex": {"target_modules": list(LINEARS), "exclude_modules": r".*mlp\..*"},
    "one layer": {"target_modules": ["q_proj", "v_proj"], "layers_to_transform": 1},
    "listed layers": {"target_modules": list(LINEARS), "layers_to_transform": [0]},
}


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """An adapter on every linear of both layers, saved by PEFT."""
    path, _ = save_peft_adapter(tmp_path_factory.mktemp("full") / "a", rank=4, modules=LINEARS)
    return path


def narrowed(full, tmp_path, selection):
    """The same file, its config selecting less (as a hand-edited config would)."""
    path = tmp_path / "narrow"
    shutil.copytree(full, path)
    config = json.loads((path / "adapter_config.json").read_text())
    config.update({"exclude_modules": None, "layers_to_transform": None} | selection)
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


def peft_modules(path) -> dict[tuple[int, str], torch.Tensor]:
    """(layer, module) -> lora_A weight of every module PEFT loaded the adapter into."""
    model = PeftModel.from_pretrained(tiny_llama(), path)
    found = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            layer = int(name.split(".layers.")[1].split(".")[0])
            found[(layer, name.rsplit(".", 1)[1])] = module.lora_A["default"].weight.detach()
    return found


@pytest.mark.parametrize("selection", SELECTIONS.values(), ids=SELECTIONS.keys())
def test_the_modules_served_are_the_modules_peft_loads(full, tmp_path, selection):
    path = narrowed(full, tmp_path, selection)
    want = peft_modules(path)
    assert want
    adapter = parse_adapter(read_adapter_files(str(path)), base=TINY_SPEC)
    assert set(adapter.modules) == set(want)
    for key, a in want.items():
        torch.testing.assert_close(adapter.modules[key].a.float(), a.float())
    dropped = 2 * len(LINEARS) - len(want)  # none for all-linear: the file holds linears only
    noted = [w.split(" that ")[0] for w in adapter.warnings if "ignored the weights" in w]
    assert noted == ([f"adapter: ignored the weights of {dropped} module(s)"] if dropped else [])


def test_a_config_selecting_every_module_warns_of_nothing(full):
    adapter = parse_adapter(read_adapter_files(str(full)), base=TINY_SPEC)
    assert len(adapter.modules) == 2 * len(LINEARS)
    assert not any("ignored" in w for w in adapter.warnings)


@pytest.mark.parametrize(
    "selection, message",
    [
        ({"target_modules": ["lm_head"]}, "holds no LoRA module (lora_A and lora_B) that its"),
        ({"target_modules": "(q_proj"}, "target_modules '(q_proj' is not a valid regex"),
        ({"target_modules": 7}, "target_modules must be a list of module names or one regex"),
        ({"layers_to_transform": [0, -1]}, "layers_to_transform must be a layer index or a"),
        ({"exclude_modules": [1]}, "exclude_modules must be a list of module names or one"),
    ],
)
def test_bad_or_empty_selections_are_refused_naming_the_field(full, tmp_path, selection, message):
    path = narrowed(full, tmp_path, selection)
    with pytest.raises(AdapterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_adapter(read_adapter_files(str(path)), base=TINY_SPEC)
