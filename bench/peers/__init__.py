"""Peer engines for the benchmark, each run in a virtualenv of its own (see venvs.py)."""
