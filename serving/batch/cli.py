"""`loraserve batch ...`: submit a JSONL file of Workers-AI requests to a server as one
batch, follow its progress, and write its results as JSONL.

The commands go to a running server (--server, default http://127.0.0.1:8000) with the key
in LORASERVE_API_KEY, as `loraserve adapters` does. Every failure prints `error: ...` and
exits with status 1; a file with a malformed line sends nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from adapters.cli.http_json import (
    DEFAULT_SERVER,
    TIMEOUT,
    RemoteError,
    api_key,
    call_json,
    server_url,
)
from serving.batch.request_file import RequestFileError, read_requests, with_line_numbers

POLL_S = 0.5
# OpenAI batch statuses after which nothing changes any more.
FINISHED = ("completed", "cancelled", "failed", "expired")
WORKERS_ENDPOINT = "/ai/run"
app = typer.Typer(
    help="Submit Workers-AI requests as one batch, follow it, and fetch its results.",
    no_args_is_help=True,
)
err = Console(stderr=True)

ServerOption = Annotated[
    str,
    typer.Option("--server", help="The loraserve server; key from LORASERVE_API_KEY."),
]
IdArgument = Annotated[str, typer.Argument(help="The batch's id (batch_...).")]


def _fail(message: str) -> None:
    one_line = " ".join(message.split())
    err.print(f"[red]error:[/red] {escape(one_line)}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


class _Server:
    """JSON calls to a loraserve server; any failure ends the command with its message."""

    def __init__(self, url: str) -> None:
        try:  # a malformed URL or key is named here, before any request
            self.url, self.key = server_url(url), api_key()
        except RemoteError as exc:
            _fail(str(exc))
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        self.client = _client(self.url, headers)

    def call(
        self, method: str, path: str, explain: Callable[[str], str] | None = None, **kwargs
    ) -> dict:
        """The JSON answer; a refusal fails with the server's message, passed through
        explain when given."""
        try:
            return call_json(self.client, method, path, key=self.key, **kwargs)
        except RemoteError as exc:
            _fail(explain(str(exc)) if explain else str(exc))

    def batch(self, batch_id: str) -> dict:
        """The OpenAI batch object of batch_id."""
        return self.call("GET", f"/v1/batches/{quote(batch_id, safe='')}")


def _client(url: str, headers: dict[str, str]) -> httpx.Client:
    """The HTTP client every command uses (a seam for tests to give it a transport)."""
    return httpx.Client(base_url=url, headers=headers, timeout=TIMEOUT)


def _model_path(model: str) -> str:
    return f"/ai/run/{quote(model, safe='/@:')}"  # model ids such as @cf/meta/x keep their "/"


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="JSONL: one Workers-AI body per line.")],
    model: Annotated[str, typer.Option("--model", help="The model to run them on.")],
    server: ServerOption = DEFAULT_SERVER,
) -> None:
    """Check every line, then submit them as one batch; prints the batch's id."""
    try:
        requests, numbers = read_requests(file)
    except RequestFileError as exc:
        for problem in exc.problems:
            err.print(f"[red]error:[/red] {escape(problem)}", highlight=False, soft_wrap=True)
        _fail(str(exc))
    api = _Server(server)
    answer = api.call(
        "POST",
        _model_path(model),
        explain=lambda message: with_line_numbers(message, numbers),
        params={"queueRequest": "true"},
        json={"requests": requests},
    )
    result = answer.get("result") or {}
    if not isinstance(result.get("request_id"), str):
        _fail(f"unexpected answer from the server: {json.dumps(answer)[:200]}")
    typer.echo(result["request_id"])


def _counts(batch: dict) -> tuple[int, int, int]:
    counts = batch.get("request_counts") or {}
    return counts.get("total", 0), counts.get("completed", 0), counts.get("failed", 0)


def _summary(batch: dict) -> str:
    """One line on where a batch stands."""
    status = batch.get("status", "unknown")
    total, completed, failed = _counts(batch)
    tally = f"{completed} succeeded, {failed} failed"
    if status == "completed":
        return f"done: {tally}"
    if status == "cancelled":
        return f"cancelled: {tally}, {total - completed - failed} cancelled"
    if status in FINISHED:  # failed, expired: say why when the server does
        errors = (batch.get("errors") or {}).get("data") or []
        why = "; ".join(str(e.get("message")) for e in errors if isinstance(e, dict))
        return f"{status}: {tally}" + (f" ({why})" if why else "")
    return f"{status}: {completed + failed} of {total} finished ({tally})"


@app.command()
def status(
    batch_id: IdArgument,
    server: ServerOption = DEFAULT_SERVER,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="Print where it stands once; do not follow it.")
    ] = False,
) -> None:
    """Follow a batch with a progress bar until it finishes, then print a summary."""
    api = _Server(server)
    batch = api.batch(batch_id)
    if not no_wait:
        try:
            batch = _follow(api, batch_id, batch)
        except KeyboardInterrupt:
            err.print("stopped following; the batch goes on", highlight=False)
            raise typer.Exit(130) from None
    typer.echo(_summary(batch))


def _follow(api: _Server, batch_id: str, batch: dict) -> dict:
    """Poll until the batch finishes, drawing its progress on stderr; its last state."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    # Off the terminal (a pipe, a log) the bar would only leave a blank line behind.
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task(batch_id, total=None)
        while True:
            total, completed, failed = _counts(batch)
            status = batch.get("status", "")
            progress.update(
                task, total=total or None, completed=completed + failed, description=status
            )
            if status in FINISHED:
                return batch
            time.sleep(POLL_S)
            batch = api.batch(batch_id)


@app.command()
def results(
    batch_id: IdArgument,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write here instead of stdout.")
    ] = None,
    server: ServerOption = DEFAULT_SERVER,
) -> None:
    """Write a finished batch's responses as JSONL, in submission order."""
    api = _Server(server)
    batch = api.batch(batch_id)
    endpoint, model = batch.get("endpoint"), batch.get("model")
    if endpoint != WORKERS_ENDPOINT:
        files = f"output {batch.get('output_file_id')}, errors {batch.get('error_file_id')}"
        _fail(
            f"batch {batch_id} came through the OpenAI Batch API ({endpoint}); its results "
            f"are files ({files}) at GET /v1/files/ID/content"
        )
    answer = api.call("POST", _model_path(str(model)), json={"request_id": batch_id})
    result = answer.get("result") or {}
    state = result.get("status")
    total, completed, failed = (result.get(k, 0) for k in ("total", "completed", "failed"))
    if state not in ("done", "cancelled"):
        _fail(
            f"batch {batch_id} is still {state}: {completed + failed} of {total} finished "
            f"({completed} succeeded, {failed} failed); `loraserve batch status {batch_id}` "
            "waits for it"
        )
    responses = result.get("responses") or []
    lines = [json.dumps(r, ensure_ascii=False) for r in responses]
    if output is None:
        for line in lines:
            typer.echo(line)
    else:
        try:
            output.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        except OSError as exc:
            _fail(f"cannot write {output}: {exc}")
    ok = sum(1 for r in responses if r.get("success"))
    where = f" to {output}" if output is not None else ""
    note = f", {total - len(responses)} cancelled (left out)" if state == "cancelled" else ""
    err.print(
        f"wrote {len(responses)} result(s){where}: {ok} succeeded, {len(responses) - ok} failed"
        + note,
        highlight=False,
        soft_wrap=True,
    )
