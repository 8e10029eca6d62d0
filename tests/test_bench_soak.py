"""The soak's short runs: `loraserve serve`, and the one-process server paging many adapters
beside a batch; each must end with zero errors and print its table row."""

import re

import pytest

from tests.test_bench_scripts import _run


@pytest.mark.slow
def test_soak_short_against_loraserve_serve():
    # Starts `loraserve serve` (Ray) for a few seconds of streams: zero errors or exit 1.
    out = _run("bench.soak", "--short")
    row = _soak_row(out, "python -m bench.soak --short")
    assert row["errors"] == "0" and int(row["requests"]) > 0, out
    assert " -> " in row["replica RSS, MiB"] and " -> " in row["tree RSS, MiB"], out
    processes = re.search(r"the tree: (\d+) processes", out)
    assert processes and int(processes[1]) > 1, out  # Ray's processes beside the replica


@pytest.mark.slow
def test_soak_short_rotates_many_adapters_beside_a_batch_on_the_local_server():
    # The one-process server, 12 adapters on a slab for 6, an OpenAI batch beside the streams.
    out = _run("bench.soak", "--short", "--local", "--adapters", "12", "--batch")
    row = _soak_row(out, "python -m bench.soak --short --local --adapters 12 --batch")
    assert row["errors"] == "0" and row["batch items"].endswith(" done, 0 failed"), out
    assert int(row["batch items"].split()[0]) > 0, out
    slab = re.search(r"slab: (\d+) adapters resident of (\d+) slots.*?(\d+) evictions", out)
    assert slab and slab[1] == slab[2] == "6" and int(slab[3]) > 0, out  # paged in and out


def _soak_row(out: str, command: str) -> dict[str, str]:
    """The soak's table row, by column name; the row names the command it ran."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("| command |"))
    names = [c.strip() for c in lines[at].strip("|").split("|")]
    cells = [c.strip() for c in lines[at + 2].strip("|").split("|")]
    assert cells[0] == f"`{command}`", out
    return dict(zip(names, cells, strict=True))
