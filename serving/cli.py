"""The `loraserve` command line."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import typer

from adapters.cli import app as adapters_app

app = typer.Typer(
    name="loraserve",
    help="Serve one base LLM and thousands of LoRA adapters of it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version() -> str:
    try:
        return version("loraserve")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"loraserve {_version()}")
        raise typer.Exit()


@app.callback()
def main(
    version_: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the version and exit.",
    ),
) -> None:
    """Serve one base LLM and thousands of LoRA adapters of it."""


app.add_typer(adapters_app, name="adapters")


@app.command()
def quantize(
    src: Path = typer.Argument(..., help="A Hugging Face model folder."),
    dst: Path = typer.Argument(..., help="Where to write the FP8 checkpoint (new or empty)."),
) -> None:
    """Write an FP8 checkpoint (per-channel e4m3 linears) that loads without quantizing again."""
    from serving.model.errors import ModelLoadError
    from serving.model.quantize import quantize_checkpoint

    try:
        count = quantize_checkpoint(src, dst)
    except ModelLoadError as exc:
        typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {dst} ({count} linears in FP8)")
