"""`loraserve adapters ...`: upload, list, show, delete and mark public adapters in a
registry or on a server.

With --registry URI the registry is used directly, in the namespace of --tenant (default
"default"; list without it shows every tenant's names), and `gc` collects the versions
nothing uses any more; only upload makes a registry that does not exist yet. Otherwise the commands go to a running server (--server, default
http://127.0.0.1:8000) with the key in LORASERVE_API_KEY, whose tenant is the namespace
unless --tenant names another (which the server allows admin keys only), and the server
validates against the model it serves. Every failure prints one line naming the problem
and exits with status 1; nothing is stored unless the adapter validated completely.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn
from rich.table import Table

from adapters.cli.http_json import DEFAULT_SERVER, RemoteError
from adapters.cli.remote import RemoteCatalogue
from adapters.errors import AdapterError
from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.registry.names import validate_name, validate_tenant
from adapters.registry.registry import Registry

DEFAULT_TENANT = "default"

app = typer.Typer(
    help="Upload, list, show, delete and mark public LoRA adapters.", no_args_is_help=True
)
out = Console()
err = Console(stderr=True)

RegistryOption = Annotated[
    str | None,
    typer.Option(
        "--registry", help="Registry URI (file:///path, s3://bucket/prefix, or a folder)."
    ),
]
ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        help=f"A loraserve server (default {DEFAULT_SERVER}); key from LORASERVE_API_KEY.",
    ),
]
NameArgument = Annotated[str, typer.Argument(help="Adapter name.")]
TenantOption = Annotated[
    str | None,
    typer.Option(
        "--tenant",
        help='The namespace (default: "default" in --registry, the key\'s own on a server).',
    ),
]


def _fail(message: str) -> None:
    one_line = " ".join(message.split())  # library messages may span lines; ours never do
    err.print(f"[red]error:[/red] {escape(one_line)}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@contextmanager
def _failing(*, writes: bool = False) -> Iterator[None]:
    """A catalogue's error ends the command with its message, and, where the command writes,
    an OSError with "registry write failed"."""
    try:
        yield
    except (AdapterError, RemoteError) as exc:
        _fail(str(exc))
    except OSError as exc:
        if not writes:
            raise
        _fail(f"registry write failed: {exc}")


def _catalogue(
    registry: str | None,
    server: str | None,
    *,
    name: str | None = None,
    tenant: str | None = None,
    create: bool = False,
) -> Registry | RemoteCatalogue:
    """The registry named by --registry, else the server (--server or the default).

    name and tenant, when given, are checked first, so a bad one gets the same message
    either way and nothing is opened or sent for it. Only create (an upload) makes a
    registry that is not there yet; reading a mistyped one must not leave it behind.
    """
    if registry is not None and server is not None:
        _fail("give either --registry or --server, not both")
    with _failing():
        try:
            if name is not None:
                validate_name(name)
            if tenant is not None:
                validate_tenant(tenant)
            if registry is None:
                return RemoteCatalogue(server or DEFAULT_SERVER)
            return Registry(registry, create=create)
        except AdapterError:
            raise  # a ValueError with its own message, as _failing gives it
        except (OSError, ValueError, ImportError) as exc:
            _fail(f"cannot open registry {registry}: {exc}")


@app.command()
def upload(
    path: Path = typer.Argument(..., help="Adapter folder, .tar.gz or .zip (PEFT's files)."),
    name: str = typer.Option(..., "--name", help="The adapter's name."),
    draft: Path | None = typer.Option(None, "--draft", help="A LoRA for the draft model."),
    base: Path | None = typer.Option(
        None, "--base", help="Base model folder to check shapes against."
    ),
    registry: RegistryOption = None,
    server: ServerOption = None,
    tenant: TenantOption = None,
) -> None:
    """Validate an adapter locally, then publish it; prints name@digest."""
    catalogue = _catalogue(registry, server, name=name, tenant=tenant, create=True)
    with _failing(writes=True):
        spec = BaseModelSpec.from_dir(base) if base else None
        with _progress() as progress:
            task = progress.add_task("validating", total=None)
            adapter = load_adapter(
                path, draft=draft, base=spec, base_name=base.name if base else None
            )
            progress.update(
                task, description=f"publishing {name}", total=adapter.num_bytes, completed=0
            )
            if isinstance(catalogue, RemoteCatalogue):
                sent = catalogue.upload(
                    name, adapter, lambda n: progress.update(task, advance=n), tenant
                )
                ref, warnings = sent["version"], [*adapter.warnings, *sent.get("warnings", ())]
            else:
                version = catalogue.publish(name, adapter, tenant or DEFAULT_TENANT)
                ref, warnings = version.ref, adapter.warnings
            progress.update(task, completed=adapter.num_bytes)
    for warning in dict.fromkeys(warnings):
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True)
    out.print(ref, highlight=False)


@app.command("list")
def list_(
    registry: RegistryOption = None,
    server: ServerOption = None,
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", help="Only this tenant's names (default: all this key may see)."),
    ] = None,
) -> None:
    """List adapters: name, version, owner, public, rank, LoRA variants, modules, size."""
    catalogue = _catalogue(registry, server, tenant=tenant)
    with _failing():
        entries = catalogue.list(tenant)
    table = Table(
        "name", "version", "owner", "public", "rank", "variants", "modules", "bytes", box=None
    )
    for e in entries:
        table.add_row(
            e.name,
            e.digest[:12],
            e.owner,
            "yes" if e.public else "",
            str(e.rank),
            ",".join(e.variants),
            ",".join(e.target_modules),
            str(e.num_bytes),
        )
    out.print(table)


@app.command()
def show(
    name: NameArgument,
    registry: RegistryOption = None,
    server: ServerOption = None,
    tenant: TenantOption = None,
) -> None:
    """Show one adapter and its version history."""
    catalogue = _catalogue(registry, server, name=name, tenant=tenant)
    with _failing():
        entry = catalogue.show(name, _owner(catalogue, tenant))
    for label, value in _fields(entry):
        out.print(f"{label:<10} {value}", highlight=False)


@app.command()
def delete(
    name: NameArgument,
    registry: RegistryOption = None,
    server: ServerOption = None,
    tenant: TenantOption = None,
) -> None:
    """Delete a name (its versions stay readable to replicas that loaded them)."""
    catalogue = _catalogue(registry, server, name=name, tenant=tenant)
    with _failing():
        catalogue.delete(name, _owner(catalogue, tenant))
    out.print(f"deleted {name}", highlight=False)


@app.command("public")
def public(
    name: NameArgument,
    off: Annotated[bool, typer.Option("--off", help="Make it private again.")] = False,
    registry: RegistryOption = None,
    server: ServerOption = None,
    tenant: TenantOption = None,
) -> None:
    """Mark an adapter public (usable by every tenant), or private with --off (servers: admins)."""
    catalogue = _catalogue(registry, server, name=name, tenant=tenant)
    with _failing(writes=True):
        entry = catalogue.set_public(name, _owner(catalogue, tenant), not off)
    state = "public" if entry.public else "private"
    out.print(f"{entry.name} is {state} (owner {entry.owner})", highlight=False)


@app.command()
def gc(
    registry: Annotated[
        str, typer.Option("--registry", help="Registry URI (file:///path, s3://..., a folder).")
    ],
    grace_hours: Annotated[
        float, typer.Option("--grace-hours", min=0, help="Keep versions stored this recently.")
    ] = 24.0,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would go; remove nothing.")
    ] = False,
) -> None:
    """Remove versions no name refers to and no running replica leases."""
    catalogue = _catalogue(registry, None)
    with _failing():  # a registry's: no RemoteError
        digests = catalogue.gc(grace_s=grace_hours * 3600, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for digest in digests:
        out.print(f"{verb} {digest}", highlight=False)
    out.print(f"{verb} {len(digests)} unused version(s)", highlight=False)


def _owner(catalogue: Registry | RemoteCatalogue, tenant: str | None) -> str | None:
    """The owner a catalogue call names: a registry needs one; None asks a server for the
    key's own tenant."""
    return tenant if isinstance(catalogue, RemoteCatalogue) else tenant or DEFAULT_TENANT


def _fields(entry):
    yield "name", entry.name
    yield "version", entry.digest
    yield "owner", entry.owner
    yield "public", "yes" if entry.public else "no"
    yield "rank", entry.rank
    yield "variants", ", ".join(entry.variants) or "plain LoRA"
    yield "modules", ", ".join(entry.target_modules)
    yield "bytes", entry.num_bytes
    yield "updated", entry.updated
    for digest in getattr(entry, "history", ()):
        yield "history", digest


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), console=err, transient=True
    )
