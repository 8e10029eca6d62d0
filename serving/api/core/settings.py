"""What the HTTP app needs to know besides the generator, read once at start-up."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from adapters.format.base_model import BaseModelSpec
from adapters.registry.registry import Registry
from serving.api.core.caller import Principal
from serving.api.core.keys_file import load_keys
from serving.config import ServeConfig
from serving.model.checkpoint import model_folder
from serving.model.hf_config import load_model_config
from serving.model.tokenizer import Tokenizer, load_tokenizer


@dataclass(frozen=True)
class AppSettings:
    """The served model, where adapters live, who may call, and the readiness flag.

    `ready` is set by whoever starts the app once the preloads are published; /readyz
    answers 200 only while it is set and the generator is ready.
    """

    model_id: str
    max_model_len: int  # prompt + output tokens, the engine's limit
    tokenizer: Tokenizer
    registry: Registry
    base_spec: BaseModelSpec
    draft_spec: BaseModelSpec | None = None  # the draft model's, when one is configured
    max_lora_rank: int = 64
    keys: Mapping[str, Principal] = field(default_factory=dict)  # key -> caller; empty: open
    # server.insecure: keyless yet reachable beyond loopback, so no Host check (see gate)
    insecure: bool = False
    max_body_bytes: int = 32 * 2**20
    max_batch_bytes: int = 10 * 2**20  # a queued batch's or batch file's body (batch.*)
    batch_ttl_s: float = 72 * 3600  # batch.ttl_hours: how long jobs and files are kept
    # An adapter upload's body (POST /v1/adapters), None: max_body_bytes. upload_limit()
    # sizes it to the largest adapter the served model takes, which server.max_body_mb,
    # sized for prompts, is far below for real models (a rank-16 Llama-3-8B adapter on
    # every linear is 84 MB in bfloat16).
    max_upload_bytes: int | None = None
    vocab_size: int | None = None  # token ids a prompt may hold; None: the tokenizer's
    # A stream whose client stops reading is closed, and its request aborted, once one write
    # has waited this long (a reader that keeps up never makes a write wait).
    send_timeout_s: float = 30.0
    ready: threading.Event = field(default_factory=threading.Event)
    owned_by: str = "loraserve"  # /v1/models' owned_by of the base model
    # tenant -> its limits (limits.* merged with limits.tenants.NAME; None = unlimited)
    limits_of: Callable[[str], Mapping[str, int | None]] = field(default=lambda tenant: {})
    # model.tool_call_format: how the model writes tool calls; "auto": its chat template says
    tool_call_format: str = "auto"

    @property
    def num_token_ids(self) -> int:
        return self.vocab_size if self.vocab_size is not None else self.tokenizer.vocab_size


def settings_from_config(cfg: ServeConfig) -> AppSettings:
    """Settings for cfg, reading the model folder's config and tokenizer but not its weights."""
    folder = model_folder(cfg.model.path)  # a URL's copy, made once per machine
    model = load_model_config(folder)
    # The engine serves no further than the model's context (sliding layers attend through
    # their windows, which cap nothing).
    context = model.max_position_embeddings
    draft = None
    if cfg.draft.method == "draft_model":
        draft = served_spec(model_folder(cfg.draft.path), cfg.model.dtype, cfg.lora.embeddings)
    # Before the registry is opened (which creates its folder): a bad keys file touches nothing.
    keys = load_keys(cfg.server.api_keys_file)
    base_spec = served_spec(folder, cfg.model.dtype, cfg.lora.embeddings)
    return AppSettings(
        model_id=cfg.model.id,
        max_model_len=min(cfg.model.max_model_len, context),
        tokenizer=load_tokenizer(folder),
        registry=Registry(cfg.lora.registry),
        base_spec=base_spec,
        draft_spec=draft,
        max_lora_rank=cfg.lora.max_lora_rank,
        keys=keys,
        tool_call_format=cfg.model.tool_call_format,
        insecure=cfg.server.insecure,
        max_body_bytes=cfg.server.max_body_mb * 2**20,
        max_batch_bytes=cfg.batch.max_payload_mb * 2**20,
        batch_ttl_s=cfg.batch.ttl_hours * 3600,
        max_upload_bytes=upload_limit(
            cfg.server.max_body_mb * 2**20, cfg.lora.max_lora_rank, base_spec, draft
        ),
        vocab_size=model.vocab_size,
        limits_of=cfg.limits.for_tenant,
    )


UPLOAD_OVERHEAD = 2**20  # configs, safetensors headers and the multipart framing


def upload_limit(
    body_limit: int, rank: int, base: BaseModelSpec, draft: BaseModelSpec | None
) -> int:
    """The largest adapter upload worth reading: a float32 adapter at `rank` on every module
    of the model (and of the draft model, its companion), never below body_limit."""
    largest = base.largest_adapter_bytes(rank)
    if draft is not None:
        largest += draft.largest_adapter_bytes(rank)
    return max(body_limit, largest + UPLOAD_OVERHEAD)


def served_spec(model_dir, dtype: str, embeddings: bool = False) -> BaseModelSpec:
    """The model's spec for checking adapters, with the dtype it is served in; LoRA on the
    embedding and the LM head only where the server serves it (lora.embeddings).

    An adapter is bounded against the activations' range (adapters.format.overflow): a configured
    model.dtype is that range; with `auto` the checkpoint's own dtype is, or one as wide.
    """
    spec = BaseModelSpec.from_dir(model_dir)
    spec = spec if embeddings else spec.without_outer()
    return spec if dtype == "auto" else dataclasses.replace(spec, dtype=dtype)
