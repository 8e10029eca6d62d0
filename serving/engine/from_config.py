"""One replica's engine, built from the server config: model, draft, adapter slabs, KV size.

Nothing here imports ray, so the same function builds a replica's engine under Ray Serve
and an in-process one anywhere else.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import tokenizers
import torch

from adapters.errors import AdapterError, RegistryUnavailable
from adapters.format.adapter import Adapter
from adapters.format.base_model import BaseModelSpec
from adapters.registry.registry import Registry
from adapters.slab.slab import AdapterSlab
from serving.config import ServeConfig
from serving.engine import memory_budget
from serving.engine.engine import Engine, EngineConfig
from serving.engine.memory_budget import AdapterMemory, adapter_memory
from serving.engine.scheduler import SchedulerConfig
from serving.engine.speculative.config import SpecConfig
from serving.model.checkpoint import model_folder
from serving.model.hf_config import load_model_config
from serving.model.loader import load_model
from serving.model.step_plan import window_reach

# num_blocks: auto on a CPU takes this share of the memory available at start, at most the
# cap: the host also holds the weights, the adapter host tier and the server itself.
CPU_KV_SHARE = 0.25
CPU_KV_CAP_BYTES = 8 << 30
# On a GPU the weights and slabs are allocated first; this share of what is left becomes
# KV, the rest is headroom for activations and the allocator's fragmentation.
GPU_KV_SHARE = 0.85
log = logging.getLogger("loraserve.deploy")


def cpu_threads(num_cpus: float) -> int:
    """Torch threads of a CPU replica: the cores it reserves, at least one.

    More threads than that contend with the replica's HTTP side and other replicas for the
    same cores: on a 2-core host under load, 2 threads served no faster than 1 (bench/README.md,
    "The server under load").
    """
    return max(1, int(num_cpus))


def build_engine(cfg: ServeConfig) -> Engine:
    """Load the model (and draft), make the adapter slabs and size the KV cache; not started."""
    check_draft_vocab(cfg)  # before seconds of loading weights
    wanted = "cuda" if cfg.deploy.resources.num_gpus > 0 else "cpu"
    if wanted == "cpu":
        torch.set_num_threads(cpu_threads(cfg.deploy.resources.num_cpus))
    load = {"quantization": cfg.model.quantization, "dtype": cfg.model.dtype, "device": wanted}
    target = load_model(cfg.model.path, **load)
    draft = load_model(cfg.draft.path, **load) if cfg.draft.method == "draft_model" else None
    # Slabs and the KV budget follow where the loader put the weights, which is what the
    # forward pass runs on, even where that differs from the device asked for.
    device = target.model.embed.device.type
    registry = Registry(cfg.lora.registry)
    spec = BaseModelSpec.from_dir(target.path)

    def fetch(version: str) -> Adapter:
        # verify=False: publish validated the whole adapter; a replica re-checks only shapes.
        try:
            return registry.load(version, base=spec, max_rank=cfg.lora.max_lora_rank, verify=False)
        except RegistryUnavailable as exc:
            # The request's error reaches its client: the backend's paths stay in the log.
            log.warning("adapter %s: %s", version, exc)
            raise AdapterError("the adapter registry cannot be reached; try again") from None

    def fetch_companion(version: str) -> Adapter:
        adapter = fetch(version)
        if adapter.draft is None:  # the draft then proposes without an adapter
            raise LookupError(f"adapter {version} has no draft-model companion")
        # The draft slab is keyed by the adapter's version, and checks a loaded adapter's
        # digest against it; the adapter's digest covers its companion, so it names it.
        return dataclasses.replace(adapter.draft, digest=adapter.digest)

    memory = adapter_memory(cfg, device)  # the models are loaded; the KV is sized below
    slab = _slab(cfg, spec, target.model, device, fetch, memory)
    draft_slab = None
    if draft is not None:
        draft_spec = BaseModelSpec.from_dir(draft.path)
        # As many pages as the target's slab, counted in adapters of max_lora_rank.
        num_slots = slab.num_pages // slab.costs.pages_of(cfg.lora.max_lora_rank)
        draft_memory = memory.for_draft(spec, draft_spec, cfg.lora.max_lora_rank, num_slots)
        draft_slab = _slab(cfg, draft_spec, draft.model, device, fetch_companion, draft_memory)
    models = [target.model] + ([draft.model] if draft else [])
    config = EngineConfig(
        max_model_len=cfg.model.max_model_len,
        block_size=cfg.cache.block_size,
        num_blocks=num_kv_blocks(cfg, models, device),
        enable_prefix_caching=cfg.cache.prefix_caching,
        cuda_graphs=cfg.model.cuda_graphs,
        scheduler=SchedulerConfig(
            max_num_seqs=cfg.scheduler.max_num_seqs,
            max_num_batched_tokens=cfg.scheduler.max_num_batched_tokens,
            max_loras=cfg.lora.max_loras,  # None: as many as the slab holds
        ),
        speculative=SpecConfig(
            method=cfg.draft.method,
            num_speculative_tokens=cfg.draft.num_speculative_tokens,
            ngram_min=cfg.draft.ngram_min,
            ngram_max=cfg.draft.ngram_max,
            max_batch_size=cfg.draft.max_batch_size,
            adaptive=cfg.draft.adaptive,
        ),
    )
    return Engine(
        target.model,
        target.tokenizer,
        config,
        slab=slab,
        draft_model=draft.model if draft else None,
        draft_slab=draft_slab,
    )


def check_draft_vocab(cfg: ServeConfig) -> None:
    """ValueError unless the draft model, if any, has the target's vocabulary: as many logit
    rows, and the same id for every token of its tokenizer.json.

    The target verifies the draft's token ids against its own distribution row by row; under
    another vocabulary the ids mean other tokens (or fall outside the target's rows).
    Only config.json and tokenizer.json are read, so this fails before any weights load.
    """
    if cfg.draft.method != "draft_model":
        return
    target, draft = model_folder(cfg.model.path), model_folder(cfg.draft.path)
    sizes = load_model_config(target).vocab_size, load_model_config(draft).vocab_size
    if sizes[0] != sizes[1]:
        raise ValueError(
            f"draft.path {draft}: the draft model's vocabulary has {sizes[1]} tokens, the "
            f"target's {sizes[0]}; speculative decoding needs a draft with the target's "
            "vocabulary (the same tokenizer)"
        )
    files = target / "tokenizer.json", draft / "tokenizer.json"
    if not all(f.is_file() for f in files):
        return  # loading the model names the missing file
    vocabs = [
        tokenizers.Tokenizer.from_file(str(f)).get_vocab(with_added_tokens=True) for f in files
    ]
    differing = sorted({token for token, _ in set(vocabs[0].items()) ^ set(vocabs[1].items())})
    if differing:
        token = differing[0]
        raise ValueError(
            f"draft.path {draft}: the draft's tokenizer differs from the target's "
            f"({len(differing)} tokens, e.g. {token!r}: id {vocabs[1].get(token)} in the "
            f"draft, {vocabs[0].get(token)} in the target); speculative decoding "
            "needs a draft with the target's vocabulary (the same tokenizer)"
        )


def _slab(cfg: ServeConfig, spec, model, device: str, fetch, memory: AdapterMemory) -> AdapterSlab:
    """The slab for adapters of the model that spec describes, as memory sizes it; misses
    call fetch."""
    # LoRA runs in the activations' dtype (float32 or bf16), never in FP8.
    dtype = model.dtype if model.dtype in (torch.float32, torch.bfloat16) else torch.bfloat16
    try:
        slab = AdapterSlab(
            spec,
            num_slots=memory.num_slots,
            slab_bytes=memory.slab_bytes,
            max_rank=cfg.lora.max_lora_rank,
            max_cpu_loras=cfg.lora.max_cpu_loras,
            host_bytes=memory.host_bytes,
            loader=fetch,
            dtype=dtype,
            device=device,
            base_weight=model.served_weight,  # DoRA's norms, of the weights as served
            embeddings=cfg.lora.embeddings,
            max_tokens=cfg.lora.max_trainable_tokens,
        )
    except ValueError as exc:
        if memory.slab_bytes is None:
            raise
        # The bytes hold less than one adapter of max_lora_rank: a config to change.
        raise RuntimeError(
            f"lora.slab_mb {cfg.lora.slab_mb}: {exc}; raise lora.slab_mb or lower "
            "lora.max_lora_rank"
        ) from None
    log.info(
        "adapters of the %d-layer model: %d slab pages of rank %d (%.1f MiB), host tier "
        "%.1f MiB", spec.num_layers, slab.num_pages, slab.page_rank,
        slab.num_pages * slab.costs.page_bytes / (1 << 20), memory.host_bytes / (1 << 20),
    )  # fmt: skip
    return slab


def num_kv_blocks(cfg: ServeConfig, models, device: str) -> int:
    """cache.num_blocks, or for auto what the memory budget holds (every model's KV counted)."""
    if cfg.cache.num_blocks != "auto":
        return cfg.cache.num_blocks
    per_block = sum(_kv_bytes_per_block(m, cfg.cache.block_size) for m in models)
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        budget = int(free * GPU_KV_SHARE)
    else:
        budget = min(int(memory_budget.available_ram() * CPU_KV_SHARE), CPU_KV_CAP_BYTES)
    num_blocks = budget // per_block
    # Any more than a full-length sequence needs feed concurrency and the prefix cache;
    # fewer could never finish a long request, so that is a start-up error. Under a sliding
    # window a sequence holds the blocks its window spans, whatever its length (kv_window.py),
    # unless a draft model's KV holds them.
    needed = math.ceil(cfg.model.max_model_len / cfg.cache.block_size)
    window = window_reach(*models)
    if window is not None and len(models) == 1:
        needed = min(needed, math.ceil(window / cfg.cache.block_size) + 1)
    if num_blocks < needed:
        raise RuntimeError(
            f"cache.num_blocks auto: {budget >> 20} MiB of KV memory holds {num_blocks} blocks "
            f"of {cfg.cache.block_size} tokens, fewer than one {cfg.model.max_model_len}-token "
            f"sequence needs ({needed}); lower model.max_model_len or set cache.num_blocks"
        )
    return num_blocks


def _kv_bytes_per_block(model, block_size: int) -> int:
    c = model.config
    itemsize = torch.empty((), dtype=model.dtype).element_size()
    return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * itemsize  # K and V
