"""A Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 2 and 3, and Qwen3-MoE,
whose MLPs are sparse: serving.model.moe) over a flat varlen batch and a paged KV cache.

Every row of a step may use a different LoRA adapter: q/k/v and gate/up are fused
linears whose adapters apply through one shrink and one multi-slice expand; o and
down are single. Linear weights may be FP8; the embeddings, the norms and the LM
head stay in the checkpoint dtype, because they are a small share of the bytes and
the embedding/LM-head rows are where quantization error shows most in the logits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from adapters.format.base_model import ROUTER, expert_of
from adapters.format.tensor_names import OUTER_LAYER
from kernels import (
    check_paged_attention,
    check_write_kv,
    paged_attention_planned,
    write_kv_planned,
)
from serving.model.adapter_embeddings import embedding_lora, own_token_logits, own_token_rows
from serving.model.checkpoint_weights import CheckpointWeights
from serving.model.gemma_config import text_weights
from serving.model.hf_config import ModelConfig
from serving.model.linear import (
    Linear,
    concat_linears,
    lora_linear,
    rms_norm,
)
from serving.model.moe import ExpertWeights, load_experts, sparse_mlp
from serving.model.rope import apply_rope, rope_attention_factor, rope_cos_sin, rope_inv_freq
from serving.model.step_lora import layer_stacks
from serving.model.step_plan import StepPlan

ATTN_MODULES = ("q_proj", "k_proj", "v_proj")
_ACTIVATIONS = {
    "silu": torch.nn.functional.silu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
}
MLP_MODULES = ("gate_proj", "up_proj")


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: Linear  # [q + 2 kv, hidden]
    o: Linear  # [hidden, q]
    post_norm: torch.Tensor  # [hidden], before the MLP (Gemma 3's pre_feedforward_layernorm)
    gate_up: Linear | None  # [2 inter, hidden]; None in a sparse layer
    down: Linear | None  # [hidden, inter]
    experts: ExpertWeights | None = None  # a sparse layer's router and experts (Qwen3-MoE)
    qk_norm: torch.Tensor | None = None  # [H + Hkv, D]: q's norm per q head, then k's (Qwen3)
    attn_out_norm: torch.Tensor | None = None  # [hidden]: on attention's output (Gemma 3)
    mlp_out_norm: torch.Tensor | None = None  # [hidden]: on the MLP's output (Gemma 3)


class LlamaModel:
    """Weights and forward; the KV cache and the adapter slab are passed in, never owned."""

    def __init__(self, config: ModelConfig, state: dict[str, torch.Tensor], *, fp8: bool, dtype):
        self.config = config
        self.dtype = dtype
        if config.text_prefixes:  # a multimodal checkpoint: its language model alone
            state = text_weights(state, config.text_prefixes)
        get = CheckpointWeights(state, dtype, config.norm_offset, config.fp8)
        vocab_hidden = (config.vocab_size, config.hidden_size)
        self.embed = get("model.embed_tokens.weight", vocab_hidden)  # [vocab, hidden]
        self.norm = get.norm("model.norm.weight", (config.hidden_size,))
        tied = config.tie_word_embeddings or "lm_head.weight" not in state
        self.lm_head = self.embed if tied else get("lm_head.weight", vocab_hidden)
        self.layers = [self._layer(get, i, fp8) for i in range(config.num_layers)]
        self._head = Linear.make(self.lm_head, None, fp8=False)  # the LM head, LoRA-able
        # [D/2] beside the weights: positions arrive on their device, and cos/sin are made there
        self.inv_freq = rope_inv_freq(config).to(self.embed.device)
        self.rope_factor = rope_attention_factor(config)  # yarn scales cos/sin; 1.0 otherwise
        # Gemma 3's sliding layers turn at a base of their own, unscaled
        self.local_inv_freq = None
        if config.local_rope_theta is not None:
            local = dataclasses.replace(config, rope_theta=config.local_rope_theta,
                                        rope_scaling=None)  # fmt: skip
            self.local_inv_freq = rope_inv_freq(local).to(self.embed.device)
        self.scale = config.attn_scale or config.head_dim**-0.5
        # [] in the model's dtype, made once: transformers rounds Gemma's scale to it first
        self.embed_scale = None
        if config.embed_scale is not None:
            self.embed_scale = torch.tensor(
                config.embed_scale, dtype=dtype, device=self.embed.device
            )
        self.act = _ACTIVATIONS[config.activation]
        # Each layer's attention window (None: the whole context): the sliding layers of
        # Mistral, Qwen2/3 and Phi-3 attend through theirs, so the context is not capped.
        self.windows = tuple(
            config.sliding_window if i in config.sliding_window_layers else None
            for i in range(config.num_layers)
        )
        self.max_context = config.max_position_embeddings

    def _layer(self, get: CheckpointWeights, i: int, fp8: bool) -> LayerWeights:
        c, p = self.config, f"model.layers.{i}."
        q, kv, hidden, inter = (
            c.num_heads * c.head_dim,
            c.num_kv_heads * c.head_dim,
            c.hidden_size,
            c.intermediate_size,
        )
        bias = c.attention_bias
        attn = f"{p}self_attn."
        mlp = f"{p}mlp."
        qk_norm = None
        if c.qk_norm:  # one weight per head row, so q and k normalize in one call
            q_norm = get.norm(f"{attn}q_norm.weight", (c.head_dim,))
            k_norm = get.norm(f"{attn}k_norm.weight", (c.head_dim,))
            qk_norm = torch.cat([q_norm.expand(c.num_heads, -1), k_norm.expand(c.num_kv_heads, -1)])
        sandwich = {}
        if c.sandwich_norms:  # Gemma 3's names: its pre-MLP norm is pre_feedforward_layernorm
            sandwich = {
                "attn_out_norm": get.norm(f"{p}post_attention_layernorm.weight", (hidden,)),
                "mlp_out_norm": get.norm(f"{p}post_feedforward_layernorm.weight", (hidden,)),
            }
        mlp_norm = "pre_feedforward_layernorm" if c.sandwich_norms else "post_attention_layernorm"
        if c.num_experts:
            sandwich["experts"] = load_experts(get, mlp, c, fp8)
        return LayerWeights(
            qk_norm=qk_norm,
            **sandwich,
            input_norm=get.norm(f"{p}input_layernorm.weight", (hidden,)),
            qkv=concat_linears(
                get.rows(f"{attn}qkv_proj", (q, kv, kv), hidden)
                if c.fused_linears
                else [
                    get.linear(f"{attn}q_proj", (q, hidden), bias),
                    get.linear(f"{attn}k_proj", (kv, hidden), bias),
                    get.linear(f"{attn}v_proj", (kv, hidden), bias),
                ],
                fp8=fp8,
            ),
            o=concat_linears([get.linear(f"{attn}o_proj", (hidden, q), c.o_proj_bias)], fp8=fp8),
            post_norm=get.norm(f"{p}{mlp_norm}.weight", (hidden,)),
            gate_up=None if c.num_experts else concat_linears(
                get.rows(f"{mlp}gate_up_proj", (inter, inter), hidden)
                if c.fused_linears
                else [
                    get.linear(f"{mlp}gate_proj", (inter, hidden), False),
                    get.linear(f"{mlp}up_proj", (inter, hidden), False),
                ],
                fp8=fp8,
            ),
            down=None if c.num_experts else concat_linears(
                [get.linear(f"{mlp}down_proj", (hidden, inter), c.mlp_bias)], fp8=fp8
            ),
        )  # fmt: skip

    def forward(self, plan: StepPlan) -> torch.Tensor:
        """logits [K, vocab] float32 of the step's logits rows; writes its K/V into plan's caches.

        plan: the step, checked, with its attention metadata and LoRA segments derived once
        (serving.model.step_plan.plan_step). Nothing is derived or read back from the device
        here, so a CUDA graph can capture it.
        """
        c, step, slab, lora = self.config, plan.inputs, plan.slab, plan.lora
        h = self.embed[step.token_ids]  # [T, hidden]
        if lora is not None and slab.serves_outer("embed_tokens"):
            embedding_lora(h, step.token_ids, slab, lora)
        if lora is not None and slab.tokens.count:
            own_token_rows(h, step.token_ids, step.adapter_slots, slab.tokens)
        if self.embed_scale is not None:  # Gemma: the adapters' rows are scaled too, as in PEFT
            h = h * self.embed_scale
        cos, sin = rope_cos_sin(self.inv_freq, step.positions, self.rope_factor)
        turns = {False: (cos.to(self.dtype), sin.to(self.dtype))}  # by whether a layer slides
        turns[True] = turns[False]
        if self.local_inv_freq is not None:
            local = rope_cos_sin(self.local_inv_freq, step.positions)
            turns[True] = (local[0].to(self.dtype), local[1].to(self.dtype))
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        for i, layer in enumerate(self.layers):
            x = rms_norm(h, layer.input_norm, c.rms_norm_eps)
            qkv = lora_linear(x, layer.qkv, layer_stacks(slab, i, ATTN_MODULES, lora), lora)
            # q and k rotate as one [T, H + Hkv, D] view of qkv: half the calls
            heads = c.num_heads + c.num_kv_heads
            qk = qkv[:, : q_size + kv_size].view(-1, heads, c.head_dim)
            if layer.qk_norm is not None:
                qk = rms_norm(qk, layer.qk_norm, c.rms_norm_eps)
            qk = apply_rope(qk, *turns[self.windows[i] is not None])
            q, k = qk[:, : c.num_heads], qk[:, c.num_heads :]
            v = qkv[:, q_size + kv_size :].view(-1, c.num_kv_heads, c.head_dim)
            k_cache, v_cache = plan.kv_caches[i]
            if plan.checks:  # LORASERVE_CHECKS=1: every layer checks its arguments too
                check_write_kv(k, v, k_cache, v_cache, step.slot_mapping)
                check_paged_attention(q, k_cache, v_cache, step.block_tables,
                                      step.context_lens, step.query_start_loc, self.scale,
                                      self.windows[i], c.attn_softcap)  # fmt: skip
            write_kv_planned(k, v, k_cache, v_cache, plan.attention.writes)
            attn = paged_attention_planned(  # [T, H, D]
                q, k_cache, v_cache, plan.attention, self.scale, self.windows[i], c.attn_softcap
            )
            o = lora_linear(
                attn.reshape(-1, q_size), layer.o, layer_stacks(slab, i, ("o_proj",), lora), lora
            )
            if layer.attn_out_norm is not None:
                o = rms_norm(o, layer.attn_out_norm, c.rms_norm_eps)
            h = h + o
            x = rms_norm(h, layer.post_norm, c.rms_norm_eps)
            if layer.experts is not None:
                d = sparse_mlp(x, layer.experts, i, c, self.act, slab, lora, step.adapter_slots)
            else:
                gu = lora_linear(x, layer.gate_up, layer_stacks(slab, i, MLP_MODULES, lora), lora)
                gate, up = gu.chunk(2, dim=-1)
                d = lora_linear(self.act(gate) * up, layer.down,
                                layer_stacks(slab, i, ("down_proj",), lora), lora)  # fmt: skip
            if layer.mlp_out_norm is not None:
                d = rms_norm(d, layer.mlp_out_norm, c.rms_norm_eps)
            h = h + d
        out = rms_norm(h[step.logits_indices], self.norm, c.rms_norm_eps)  # [K, hidden]
        if plan.head_lora is not None:
            stacks = layer_stacks(slab, OUTER_LAYER, ("lm_head",), plan.head_lora)
            logits = lora_linear(out, self._head, stacks, plan.head_lora)
        else:
            logits = self._head(out)  # [K, vocab]
        if lora is not None and slab.tokens.count and self.lm_head is self.embed:
            slots = step.adapter_slots.index_select(0, step.logits_indices)  # [K]
            own_token_logits(logits, out, slots, slab.tokens, self.embed)
        if c.final_logit_softcap is not None:
            logits = torch.tanh(logits / c.final_logit_softcap) * c.final_logit_softcap
        return logits.to(torch.float32)

    @property
    def graphable(self) -> bool:
        """Whether a decode step may be captured as a CUDA graph: not with a sparse MLP, whose
        routing is read back to the host to group its rows."""
        return not self.config.num_experts

    def linears(self) -> list[Linear]:
        """Every dense linear of the forward: each layer's four, and the LM head."""
        layers = [(w.qkv, w.o, w.gate_up, w.down) for w in self.layers]
        dense = [linear for four in layers for linear in four if linear is not None]
        return [*dense, self._head]

    def allocate_kv(self, num_blocks: int, block_size: int, device=None):
        """Zeroed (k_cache, v_cache) per layer, each [num_blocks, block_size, Hkv, D], on device
        (default: where the weights are)."""
        device = self.embed.device if device is None else device
        shape = (num_blocks, block_size, self.config.num_kv_heads, self.config.head_dim)
        return [
            (
                torch.zeros(shape, dtype=self.dtype, device=device),
                torch.zeros(shape, dtype=self.dtype, device=device),
            )
            for _ in self.layers
        ]

    def served_weight(self, layer: int, module: str) -> torch.Tensor:
        """W [out, in] of (layer, module) as this model computes with it (FP8 dequantized)."""
        if layer == OUTER_LAYER:  # the LM head (the embedding takes no DoRA)
            return self.lm_head.to(torch.float32)
        weights = self.layers[layer]
        expert = expert_of(module)
        if expert is not None:
            return weights.experts.served_weight(*expert)
        if module == ROUTER:
            return weights.experts.router.weight.to(torch.float32)
        fused, offset, rows = self._module_rows(module)
        return getattr(weights, fused).dequantized_rows(offset, rows, torch.float32)

    def _module_rows(self, module: str) -> tuple[str, int, int]:
        """(the fused linear holding module, its first row there, its number of rows)."""
        c = self.config
        q, kv, inter = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
        return {
            "q_proj": ("qkv", 0, q), "k_proj": ("qkv", q, kv), "v_proj": ("qkv", q + kv, kv),
            "o_proj": ("o", 0, c.hidden_size), "gate_proj": ("gate_up", 0, inter),
            "up_proj": ("gate_up", inter, inter), "down_proj": ("down", 0, c.hidden_size),
        }[module]  # fmt: skip
