"""Our import packages `kernels` and `adapters` share names with PyPI packages (Hugging Face
`kernels`, AdapterHub `adapters`): transformers and peft must import and work beside ours."""

import importlib.metadata
import sys

import torch


def test_transformers_and_peft_work_beside_ours():
    import adapters
    import kernels
    from tests.adapters.peft_models import tiny_llama

    assert kernels.__file__.endswith("kernels/__init__.py") and adapters.__file__
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj"]))
    out = model(torch.tensor([[1, 2, 3]])).logits
    assert out.shape == (1, 3, 100) and torch.isfinite(out).all()


def test_transformers_does_not_take_ours_for_hub_kernels():
    from transformers.utils import import_utils

    # Hub kernels are found by distribution metadata; ours is the distribution "loraserve".
    try:
        importlib.metadata.version("kernels")
        installed = True
    except importlib.metadata.PackageNotFoundError:
        installed = False
    check = getattr(import_utils, "is_kernels_available", None)
    if check is not None and not installed:
        assert not check()


def test_the_cli_names_another_kernels_package_that_shadows_ours(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from serving.cli import app

    assert CliRunner().invoke(app, ["adapters", "--help"]).exit_code == 0
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(tmp_path)
    monkeypatch.delitem(sys.modules, "kernels", raising=False)
    result = CliRunner().invoke(app, ["adapters", "--help"])
    assert result.exit_code == 2
    assert str(tmp_path / "kernels" / "__init__.py") in result.output
    assert "pip uninstall kernels" in result.output and "Traceback" not in result.output
