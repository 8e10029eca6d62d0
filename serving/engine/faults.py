"""Which request a fault belongs to, so that a step's fault fails that request only.

A request's own data (its adapter's weights, its sampling parameters, its stop strings) can
make its share of a step fail. Work that is done per row is guarded per row (Engine._guarded).
Batched work is retried one row at a time when it raises: the rows that still fail alone are
to blame. When every row fails alone the fault is the engine's, and the step fails as a whole.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from serving.engine.grammar.masks import TokenMasks
from serving.engine.sampler import SampleResult, SamplingState, sample
from serving.model.step_plan import plan_step, window_reach

logger = logging.getLogger(__name__)

T = TypeVar("T")


def blame(items: Sequence[T], run_alone: Callable[[T], object]) -> list[tuple[T, Exception]]:
    """The items whose run_alone(item) raises, each with its exception.

    Nobody is to blame (RuntimeError, and the caller fails the whole step) when no item raises
    alone, or when more than one item runs and every one raises alone: the fault is not one
    request's. One item raising alone is to blame for its own fault.
    """
    failed = []
    for item in items:
        try:
            run_alone(item)
        except Exception as exc:  # what the row's own data raises, whatever it is
            failed.append((item, exc))
    if not failed or (len(items) > 1 and len(failed) == len(items)):
        raise RuntimeError(f"{len(failed)} of {len(items)} rows fail alone: no one request's fault")
    return failed


def blame_forward(scheduled, build_one, model, kv, slab) -> list[tuple[object, str]]:
    """The scheduled items whose forward alone raises, each with the error for its caller.

    build_one(item) -> StepInputs of that item alone. Raises when no item is to blame (blame).
    Running a row alone rewrites KV it would have written anyway, and marks nothing computed.
    """
    logger.warning("a step's forward failed; running its %d rows alone", len(scheduled))

    def run_alone(item) -> None:
        with torch.inference_mode():
            model.forward(plan_step(build_one(item), kv, slab, window_reach(model)))

    failed = blame(scheduled, run_alone)
    for item, exc in failed:
        logger.error("request %s: its forward fails alone: %r", item.seq.request.request_id, exc)
    return [
        (item, f"generation failed: this request could not be run ({type(exc).__name__})")
        for item, exc in failed
    ]


def sample_each(
    logits: torch.Tensor, states: list[SamplingState], masks: TokenMasks | None = None
) -> SampleResult:
    """sample() one row at a time, after the batched call raised: a raising row gets an error.

    Each row's token is what the batched call gives it: every step of sample() is row-wise.
    """
    tokens, logprobs, errors = [], [], []
    for i, (row, state) in enumerate(zip(logits, states)):
        try:
            one = sample(row[None], [state], masks=masks.row(i) if masks else None)
        except Exception as exc:
            logger.warning("sampling one row failed: %r", exc)
            one = SampleResult(
                [0], [None], [f"sampling failed: internal error: {type(exc).__name__}"]
            )
        tokens += one.token_ids
        logprobs += one.logprobs
        errors += one.errors
    return SampleResult(tokens, logprobs, errors)
