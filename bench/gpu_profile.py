"""Where an 8B-shaped decode step's time goes on CUDA: one step under torch.profiler.

    python -m bench.gpu_profile     # on a CUDA machine, about 20 s

For bf16 and FP8 weights (random, batch 4, context 512 as in bench/gpu_model.py): the wall
time of a step, the GPU's busy time inside it, and the kernel launches and host syncs it
makes, then torch.profiler's table of the ops costing the most host time.
"""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench.gpu_model import CONTEXT, _to
from bench.model import BLOCK, decode_step, eager_forward
from bench.model_shapes import config_for, random_state
from serving.model.llama import LlamaModel

BATCH = 4
HOST_EVENTS = ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaStreamSynchronize", "cudaMemcpyAsync")


def main() -> None:
    config = config_for("llama-8b")
    state = random_state(config, torch.bfloat16, "cuda")
    for fp8 in (False, True):
        model = LlamaModel(config, state, fp8=fp8, dtype=torch.bfloat16)
        kv = model.allocate_kv(BATCH * -(-CONTEXT // BLOCK), BLOCK, "cuda")
        step = _to(decode_step(BATCH, CONTEXT, config.vocab_size), "cuda")
        for _ in range(3):
            eager_forward(model, step, kv)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(5):
            eager_forward(model, step, kv)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / 5
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            eager_forward(model, step, kv)
            torch.cuda.synchronize()
        events = prof.key_averages()
        # kernels only: an op's row repeats the time of the kernels it launched
        gpu = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA") / 1e3
        counts = {e.key: e.count for e in events if e.key in HOST_EVENTS}
        print(f"{'fp8' if fp8 else 'bf16'}: {wall * 1e3:.1f} ms a step, GPU busy {gpu:.1f} ms; "
              + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())), flush=True)  # fmt: skip
        print(events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=48))
        del model, kv


if __name__ == "__main__":
    main()
