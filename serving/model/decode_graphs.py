"""Decode steps replayed from CUDA graphs: one graph per padded batch size, captured at start.

A decode step of n sequences runs as the captured graph of the smallest size >= n (1, 2, 4,
..., 64): its index values are copied into that size's buffer (serving.model.padded_decode)
in one host-to-device copy, and one replay launches every kernel of every layer, with none
of the per-kernel launch cost that dominates small decode batches. Prefill chunks, verify
steps and larger batches run eagerly, as do steps whose slab serves a variant the graphs
leave out (lora_B biases, DoRA, embedding or LM-head LoRA, trainable tokens): those pick
rows per step, which a fixed graph cannot.

With capture=False (the CPU) a replay is the eager forward of the same padded step: what
the padding does to a batch is then checked where no GPU is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import HostIndex
from serving.model.linear import StepLora
from serving.model.llama import ATTN_MODULES, MLP_MODULES, LlamaModel
from serving.model.padded_decode import (
    Padding,
    is_decode,
    layout,
    padded_values,
    static_views,
)
from serving.model.step_plan import StepInputs, StepPlan, plan_step, window_reach

SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class _Captured:
    """One size's graph and every tensor made outside it that it reads: a replay reads them
    at their capture-time addresses, so they live as long as the graph (a freed one's memory
    goes to other tensors, and the replay reads theirs)."""

    graph: torch.cuda.CUDAGraph
    buffer: torch.Tensor  # [buffer_len] int64: the step's index values (decode_batch layout)
    logits: torch.Tensor  # [size, vocab] float32: the graph's output, overwritten each replay
    plan: StepPlan  # the plan the capture ran on: its inputs are views of `buffer`


class DecodeGraphs:
    """model.forward for decode steps of up to max(sizes) sequences, by graph replay."""

    def __init__(
        self, model: LlamaModel, kv_caches, slab, *, scratch_block: int, block_size: int,
        max_context: int, max_batch: int = SIZES[-1], capture: bool = True,
    ) -> None:  # fmt: skip
        """scratch_block: a block of kv_caches the block manager never hands out (padding
        rows write their key there); max_context: the longest sequence, in tokens."""
        if not getattr(model, "graphable", True):
            raise ValueError("this model's decode step cannot be captured as a CUDA graph: its "
                             "sparse MLP reads its routing back to the host every layer")  # fmt: skip
        top = next((s for s in SIZES if s >= max_batch), SIZES[-1])
        self.sizes = tuple(s for s in SIZES if s <= top)
        self.model, self.kv, self.slab, self.capture = model, kv_caches, slab, capture
        self.width = -(-max_context // block_size)
        self._pad = lambda size: Padding(size, self.width, scratch_block, block_size)
        # A captured projection reads its module ranks where they were at capture: only
        # views of the slab's own tables stay current as adapters come and go.
        self._lora_ok = slab is None or all(
            slab.module_ranks(0, group)._base is not None for group in (ATTN_MODULES, MLP_MODULES)
        )
        self._graphs: dict[int, _Captured] = {}
        if capture:
            pool = torch.cuda.graph_pool_handle()
            for size in reversed(self.sizes):  # largest first: the smaller reuse its memory
                self._graphs[size] = self._capture(size, pool)

    def covers(self, step: StepInputs) -> bool:
        """Whether step is a decode step the graphs can run (else: the eager forward)."""
        host = step.host
        if not is_decode(host) or len(host.context_lens) > self.sizes[-1]:
            return False
        if host.block_tables and len(host.block_tables[0]) > self.width:
            return False
        slab = self.slab
        if slab is None:
            return host.adapter_slots is None or max(host.adapter_slots, default=-1) < 0
        # Variants whose rows are picked per step are left to the eager forward.
        plain = not (slab.vectors.num_bias or slab.vectors.num_dora or slab.tokens.count)
        outer = slab.serves_outer("embed_tokens") or slab.serves_outer("lm_head")
        return self._lora_ok and plain and not outer

    def forward(self, step: StepInputs) -> torch.Tensor:
        """logits [n, vocab] float32 of a covered decode step of n sequences."""
        n = len(step.host.context_lens)
        size = next(s for s in self.sizes if s >= n)
        ranks = self.slab.host_ranks if self.slab is not None else None
        values = padded_values(self._pad(size), step.token_ids.tolist(), step.positions.tolist(),
                               step.host, ranks)  # fmt: skip
        if not self.capture:
            plan = plan_step(
                self._eager_step(values, size), self.kv, self.slab, window_reach(self.model)
            )
            return self.model.forward(plan)[:n]
        captured = self._graphs[size]
        # One copy from pinned memory; the graph's kernels follow it on the same stream.
        values = torch.tensor(values, dtype=torch.int64).pin_memory()
        captured.buffer.copy_(values, non_blocking=True)
        captured.graph.replay()
        return captured.logits[:n].clone()  # the next replay overwrites the graph's output

    def _capture(self, size: int, pool) -> _Captured:
        device = self.model.embed.device
        empty = HostIndex((0,), (), (), (), None, ())
        ranks = self.slab.host_ranks if self.slab is not None else None
        idle = padded_values(self._pad(size), [], [], empty, ranks)  # every row padding
        buffer = torch.tensor(idle, dtype=torch.int64, device=device)  # [buffer_len]
        views = static_views(buffer, size, self.width)
        f, slab = views.fields, self.slab
        step = StepInputs(f["ids"], f["positions"], f["slots"], views.block_tables,
                          f["context_lens"], f["query_starts"], views.logits_indices,
                          f["adapter_slots"] if slab is not None else None)  # fmt: skip
        lora = None
        if slab is not None:
            segments = views.segments(slab.num_slots, slab.max_rank)
            lora = StepLora(segments, slab.scales, slab.max_rank)
        # Built from the buffer's views, not by plan_step: a replay reads the addresses the
        # capture read, and the graphs leave LM-head LoRA to the eager forward (covers).
        plan = StepPlan(step, self.kv, slab, views.attention(), lora)

        def run() -> torch.Tensor:
            return self.model.forward(plan)

        # Warm up on a side stream (Triton compiles, constant tables are cached), then capture.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(2):
                run()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph, pool=pool):
            logits = run()
        return _Captured(graph, buffer, logits, plan)

    def _eager_step(self, values: list[int], size: int) -> StepInputs:
        """The padded step the graph of `size` would run, as an ordinary step with host lists."""
        spans = layout(size, self.width)
        get = {name: values[o : o + n] for name, (o, n) in spans.items()}
        tables = [tuple(get["block_tables"][i * self.width : (i + 1) * self.width])
                  for i in range(size)]  # fmt: skip
        adapters = tuple(get["adapter_slots"]) if self.slab is not None else None
        host = HostIndex(tuple(get["query_starts"]), tuple(get["context_lens"]),
                         tuple(get["slots"]), tuple(tables), adapters, tuple(range(size)))  # fmt: skip
        as_long = lambda name: torch.tensor(get[name], dtype=torch.int64)  # noqa: E731
        return StepInputs(
            as_long("ids"), as_long("positions"), as_long("slots"),
            torch.tensor(tables, dtype=torch.int32),
            torch.tensor(get["context_lens"], dtype=torch.int32),
            torch.tensor(get["query_starts"], dtype=torch.int32), torch.arange(size),
            torch.tensor(adapters, dtype=torch.int32) if adapters is not None else None, host,
        )  # fmt: skip
