"""The sections of what each engine runs: the model, speculation, adapters, KV cache, batching."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from serving.config.locations import LocalPath, ModelLocation, RegistryURI
from serving.config.section import MODEL_ID_RE, MODEL_ID_RULE, AutoOrPositive, Limit, Section

Quant = Literal["auto", "fp8", "none"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
ToolCallFormat = Literal["auto", "hermes", "llama3_json", "mistral"]
Method = Literal["none", "draft_model", "ngram"]


class ModelSection(Section):
    """The base model served."""

    id: str = Field("demo", description="Name clients pass as `model`; 1-64 of [A-Za-z0-9._-].")
    path: ModelLocation = Field(
        Path("models/demo/base"),
        description="Hugging Face model folder, or an fsspec URL (s3://...) copied once into "
        "~/.cache/loraserve/models.",
    )
    quantization: Quant = Field(
        "auto",
        description="auto = FP8 on CUDA sm_89+ or for an FP8 checkpoint, else as it is stored.",
    )
    dtype: DType = Field("auto", description="auto = the checkpoint's torch_dtype.")
    max_model_len: int = Field(2048, gt=0, description="Longest prompt + output, in tokens.")
    cuda_graphs: bool = Field(
        True, description="On a GPU, replay decode steps from CUDA graphs (no effect on a CPU)."
    )
    tool_call_format: ToolCallFormat = Field(
        "auto",
        description="How the model writes tool calls: auto = read from the chat template; "
        "hermes (<tool_call> tags: Hermes, Qwen); llama3_json (Llama 3.1+); mistral "
        "([TOOL_CALLS] and a list).",
    )

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        # ':' would make 'model:adapter' references ambiguous; the pattern excludes it.
        if not MODEL_ID_RE.match(value):
            raise ValueError(f"invalid model id {value!r}: {MODEL_ID_RULE}")
        return value


class DraftSection(Section):
    """Speculative decoding: how draft tokens are proposed and when speculation runs."""

    method: Method = Field("none", description="none = off; ngram = prompt lookup; draft_model.")
    path: ModelLocation = Field(
        Path("models/demo/draft"), description="The draft_model's folder, or an fsspec URL."
    )
    num_speculative_tokens: int = Field(4, ge=1, le=16, description="Tokens proposed per step.")
    ngram_min: int = Field(1, ge=1, description="Shortest n-gram matched (method ngram).")
    ngram_max: int = Field(4, ge=1, description="Longest n-gram matched (method ngram).")
    # Above this many running sequences verifying drafts costs more than it saves.
    max_batch_size: int = Field(8, ge=0, description="Speculate up to this many seqs; 0 = all.")
    adaptive: bool = Field(True, description="Speculate fewer tokens when few are accepted.")

    @model_validator(mode="after")
    def _check_ngram(self) -> DraftSection:
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min {self.ngram_min} exceeds ngram_max {self.ngram_max}")
        return self


class LoraSection(Section):
    """LoRA adapters: their device and host memory, where they are published, which load."""

    slab_mb: AutoOrPositive = Field(
        "auto",
        description="Device memory for adapters, in MiB, per replica (a draft model's slab "
        "holds as many adapters again); auto = 10% of the GPU memory free once the model is "
        "loaded, or on a CPU 5% of the RAM available, at most 256 MiB. A rank-r adapter takes "
        "ceil(r / 8) pages of 8 rank rows.",
    )
    host_mb: AutoOrPositive = Field(
        "auto",
        description="Host memory for adapters evicted from the device, in MiB, per replica; "
        "auto = 25% of the machine's physical memory (or its container's limit). The least "
        "recently used go first.",
    )
    max_loras: Limit = Field(
        None,
        description="null = slab_mb sizes the device slab; a number = the slab holds this "
        "many adapters of max_lora_rank (set it or slab_mb, not both).",
    )
    max_lora_rank: int = Field(64, gt=0, description="Highest adapter rank accepted.")
    max_cpu_loras: Limit = Field(
        None, description="Adapters in host memory at most (within host_mb); null = no count."
    )
    embeddings: bool = Field(
        False,
        description="Also serve LoRA on embed_tokens and lm_head (vocabulary-wide slab stacks).",
    )
    max_trainable_tokens: int = Field(
        64,
        ge=0,
        description="Token rows of its own an adapter may bring (trainable_token_indices).",
    )
    registry: RegistryURI = Field(
        "file://./registry",
        description="Where adapters are published: an fsspec URL (s3://...) or a folder; every "
        "replica must reach it.",
    )
    # Names are checked where they are published, at start-up: config imports nothing of ours.
    preload: dict[str, LocalPath] = Field(
        {}, description="Published at start, public, owned by the tenant operator: {name: path}."
    )

    @model_validator(mode="after")
    def _check_slab_size(self) -> LoraSection:
        if self.max_loras is not None and self.slab_mb != "auto":
            raise ValueError(
                f"max_loras ({self.max_loras}) and slab_mb ({self.slab_mb}) both size the "
                "device slab; set one of them"
            )
        return self


class CacheSection(Section):
    """The paged KV cache."""

    block_size: int = Field(16, gt=0, description="Tokens per KV block.")
    num_blocks: AutoOrPositive = Field("auto", description="auto = what free memory holds.")
    prefix_caching: bool = Field(True, description="Reuse KV blocks of shared prompt prefixes.")


class SchedulerSection(Section):
    """Continuous batching limits, per engine step."""

    max_num_seqs: int = Field(64, gt=0, description="Sequences running at once.")
    max_num_batched_tokens: int = Field(2048, ge=1, description="Tokens computed per step.")
