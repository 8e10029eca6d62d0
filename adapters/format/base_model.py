"""What an adapter must fit: the layers and linear shapes of a Llama-family base model.

Read from the base model's config.json (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 3: GQA, optional
head_dim). Phi-3's fused qkv_proj and gate_up_proj are its parts' shapes here: an adapter on
them is split into its parts (adapters.format.fused_modules). A mixture-of-experts base
(`num_experts` in its config) has, in place of the MLP's three, the router `gate` and each
expert's own: `experts.{e}.gate_proj` and so on (adapters.format.expert_modules).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from adapters.errors import AdapterError
from adapters.format.multimodal import is_multimodal, text_model_config

# module -> (input width, output width) in terms of the config's dimensions
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
LINEARS = _ATTN + _MLP  # every linear of a Llama decoder layer, which LoRA may target
# Phi-3's fused linears and their parts, in row order; an adapter on one is its parts' LoRA
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
FUSED_LINEARS = tuple(FUSED)
OUTER = ("embed_tokens", "lm_head")  # LoRA-targetable modules outside the layers
ROUTER = "gate"  # a sparse MLP's router [num_experts, hidden]: PEFT's name for it


def expert_module(expert: int, proj: str) -> str:
    """The module name of one expert's projection: experts.3.gate_proj."""
    return f"experts.{expert}.{proj}"


def expert_of(module: str) -> tuple[int, str] | None:
    """(expert, projection) of an expert's module name; None for any other module."""
    parts = module.split(".")
    if len(parts) == 3 and parts[0] == "experts" and parts[1].isdigit() and parts[2] in _MLP:
        return int(parts[1]), parts[2]
    return None


@dataclass(frozen=True)
class BaseModelSpec:
    """The base model's LoRA-targetable linears: name -> (in_features, out_features)."""

    num_layers: int
    shapes: dict[str, tuple[int, int]]
    dtype: str | None = None  # the checkpoint's torch_dtype, e.g. "bfloat16"; None when unknown
    # embed_tokens: (vocab, hidden), its lora_embedding_A [r, vocab]; lm_head: (hidden, vocab).
    # Empty where they are not served (a server without lora.embeddings).
    outer_shapes: dict[str, tuple[int, int]] = field(default_factory=dict)
    vocab_size: int = 0  # 0 when unknown; kept without outer_shapes (trainable tokens need it)
    num_experts: int = 0  # a sparse MLP's experts in every layer; 0: a dense MLP

    @property
    def hidden_size(self) -> int:
        return self.shapes["q_proj"][0]

    def largest_adapter_bytes(self, rank: int) -> int:
        """The tensors' size of the largest adapter this model takes at `rank`: float32 A
        and B on every linear of every layer and the outer modules, with a DoRA magnitude
        and a lora_B bias per module (out floats each)."""
        per_layer = sum(rank * (i + o) + 2 * o for i, o in self.shapes.values())
        outer = sum(rank * (i + o) + 2 * o for i, o in self.outer_shapes.values())
        return 4 * (self.num_layers * per_layer + outer)

    def module_names(self) -> str:
        """The layers' module names for a message, a sparse model's experts folded into one
        pattern each (experts.{0..127}.gate_proj), not hundreds of names."""
        dense = [m for m in self.shapes if expert_of(m) is None]
        if self.num_experts:
            dense += [f"experts.{{0..{self.num_experts - 1}}}.{m}" for m in _MLP]
        return ", ".join(dense)

    def without_outer(self) -> BaseModelSpec:
        """The same spec with no LoRA on the embedding or the LM head."""
        return dataclasses.replace(self, outer_shapes={})

    def fused_shape(self, module: str) -> tuple[int, int]:
        """(in_features, out_features) of a fused module (a key of FUSED)."""
        parts = [self.shapes[p] for p in FUSED[module]]
        return parts[0][0], sum(out for _, out in parts)

    @staticmethod
    def from_config(config: dict) -> BaseModelSpec:
        if is_multimodal(config):  # Gemma 3 4B and up: adapters fit its language model
            try:
                config = text_model_config(config)
            except ValueError as exc:
                raise AdapterError(f"base model config.json: {exc}") from None
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            kv_heads = int(config.get("num_key_value_heads") or heads)
            head_dim = int(config.get("head_dim") or hidden // max(heads, 1))
            layers = int(config["num_hidden_layers"])
            vocab = int(config.get("vocab_size") or 0)
            # transformers 5 writes num_local_experts where published configs say num_experts
            experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
            # a sparse model's MLPs are its experts; some MoE configs write no dense width
            inter = int(config["moe_intermediate_size" if experts else "intermediate_size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise AdapterError(f"base model config.json: missing or bad field {exc}") from None
        sizes = {
            "hidden_size": hidden,
            "intermediate_size": inter,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "num_hidden_layers": layers,
        }
        for key, value in sizes.items():
            if value < 1:
                raise AdapterError(f"base model config.json: {key} must be positive, got {value}")
        q, kv = heads * head_dim, kv_heads * head_dim
        mlp = {
            "gate_proj": (hidden, inter),
            "up_proj": (hidden, inter),
            "down_proj": (inter, hidden),
        }
        shapes = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
                  "o_proj": (q, hidden)}  # fmt: skip
        if experts:  # the router, then every expert's three
            shapes[ROUTER] = (hidden, experts)
            shapes.update(
                {expert_module(e, m): shape for e in range(experts) for m, shape in mlp.items()}
            )
        else:
            shapes.update(mlp)
        outer = {"embed_tokens": (vocab, hidden), "lm_head": (hidden, vocab)} if vocab > 0 else {}
        return BaseModelSpec(
            num_layers=layers, shapes=shapes, dtype=_dtype_name(config), outer_shapes=outer,
            vocab_size=vocab, num_experts=experts,
        )  # fmt: skip

    @staticmethod
    def from_dir(model_dir: str | Path) -> BaseModelSpec:
        path = Path(model_dir) / "config.json"
        try:
            config = json.loads(path.read_text())
        except FileNotFoundError:
            raise AdapterError(f"base model: {path} not found") from None
        except (OSError, ValueError) as exc:
            raise AdapterError(f"base model: cannot read {path}: {exc}") from None
        return BaseModelSpec.from_config(config)


def _dtype_name(config: dict) -> str | None:
    """The checkpoint dtype's name: transformers writes `torch_dtype`, and `dtype` since v4.56."""
    value = config.get("torch_dtype") or config.get("dtype")
    return value.removeprefix("torch.") if isinstance(value, str) else None


def module_group(module: str) -> str:
    """'self_attn' or 'mlp', the parent of a module in a Llama decoder layer (Phi-3's fused
    qkv_proj under self_attn, gate_up_proj under mlp; the router and experts under mlp)."""
    return "self_attn" if module in (*_ATTN, "qkv_proj") else "mlp"
