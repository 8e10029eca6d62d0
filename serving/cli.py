"""The `loraserve` command line."""

from __future__ import annotations

import importlib.util
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import typer

from adapters.cli.commands import app as adapters_app
from serving.batch.cli import app as batch_app

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
    _check_kernels_is_ours()


def _check_kernels_is_ours() -> None:
    """Exit with a clear error when `import kernels` would not find loraserve's package.

    Hugging Face's `kernels` distribution (which transformers 5.25 and later require) has an
    import package of the same name; installed, it shadows ours and no model would load.
    """
    spec = importlib.util.find_spec("kernels")
    ours = Path(__file__).resolve().parents[1] / "kernels" / "__init__.py"
    if spec is not None and spec.origin and Path(spec.origin).resolve() == ours:
        return
    found = spec.origin if spec is not None else "nothing"
    typer.echo(
        f"loraserve: error: `import kernels` finds {found}, not loraserve's {ours}: Hugging "
        "Face's `kernels` package shadows it (transformers 5.25 and later require it). "
        "Run `pip uninstall kernels` and `pip install 'transformers<5.25'`.",
        err=True,
    )
    raise typer.Exit(2)


app.add_typer(adapters_app, name="adapters")
app.add_typer(batch_app, name="batch")

DEMO_CONFIG = Path("configs/demo.yaml")


@app.command()
def serve(
    config: Path = typer.Option(
        DEMO_CONFIG, "--config", help="Server config (YAML); default: the built-in demo."
    ),
    host: str | None = typer.Option(
        None, "--host", help="Listen address; default: the config's server.host (127.0.0.1)."
    ),
    port: int | None = typer.Option(
        None, "--port", help="Listen port; default: the config's server.port (8000)."
    ),
    insecure: bool = typer.Option(
        False, "--insecure", help="Listen beyond loopback even with no API keys configured."
    ),
) -> None:
    """Serve the model and its adapters over HTTP until Ctrl-C (a local Ray unless configured)."""
    from serving.config import ConfigError, load_config
    from serving.deploy.exposure import load_checked_keys

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        _fail(str(exc))
    port = cfg.server.port if port is None else port
    if not 1 <= port <= 65535:
        _fail(f"--port must be in 1..65535, got {port}")
    # The options become the config the app itself checks, wherever its replicas run.
    server = {"host": host or cfg.server.host, "port": port}
    server["insecure"] = insecure or cfg.server.insecure
    cfg = cfg.model_copy(update={"server": cfg.server.model_copy(update=server)})
    try:
        load_checked_keys(cfg)  # here too, so a refusal comes before Ray starts
    except ValueError as exc:  # ConfigError, OpenServerError
        _fail(str(exc))
    # Imported here: Ray takes seconds to import, which no other command should pay.
    from serving.deploy.launch import serve_until_stopped

    try:
        serve_until_stopped(cfg, echo=typer.echo)
    except (ValueError, OSError, RuntimeError) as exc:  # AdapterError, ModelLoadError, ...
        _fail(str(exc))
    except KeyboardInterrupt:  # Ctrl-C while starting, or a second one while draining
        typer.echo("loraserve: stopped at once", err=True)
        raise typer.Exit(130) from None


def _fail(message: str) -> None:
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    raise typer.Exit(1)


@app.command()
def quantize(
    src: Path = typer.Argument(..., help="A Hugging Face model folder."),
    dst: Path = typer.Argument(..., help="Where to write the FP8 checkpoint (new or empty)."),
) -> None:
    """Write an FP8 checkpoint (compressed-tensors FP8-dynamic, per-channel e4m3 linears) that
    loads without quantizing again, here and in transformers."""
    from serving.model.errors import ModelLoadError
    from serving.model.quantize import quantize_checkpoint

    try:
        count = quantize_checkpoint(src, dst)
    except ModelLoadError as exc:
        typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {dst} ({count} linears in FP8)")
