"""`python -m serving` runs the `loraserve` command line."""

from serving.cli import app

app(prog_name="loraserve")
