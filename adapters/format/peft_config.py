"""PEFT's adapter_config.json for a LoRA adapter: what is served, what is refused and why.

Served: rank and alpha (rsLoRA's alpha / sqrt(r) too), DoRA (`use_dora`), per-module
ranks and alphas (`rank_pattern`, `alpha_pattern`), a bias on lora_B (`lora_bias`),
trainable tokens (`trainable_token_indices`, on embed_tokens), and which modules get LoRA
(`target_modules`, `exclude_modules`, `layers_to_transform`: adapters.format.peft_targets).
A pattern applies to a module as PEFT applies it: the first key `k` for which
`(.*\\.)?(k)$` matches the module's name in the model (`model.layers.3.self_attn.q_proj`).
Every refusal raises AdapterError naming the field.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import regex

from adapters.errors import AdapterError, quoted, shorten
from adapters.format.bounded_json import parse_json
from adapters.format.peft_targets import Targets, parse_targets
from adapters.format.sources import CONFIG
from adapters.format.trainable_tokens import token_indices

MAX_CONFIG_BYTES = 2**20  # PEFT writes about 1 KB
MAX_PATTERNS = 4096  # a pattern per module of a 100-layer model is 700
MAX_PATTERN_CHARS = 256
# A tenant writes the patterns, and each is matched against the model's module names on
# upload and again on every replica's load, so all of one config's matching is bounded in
# time. `re` has no bound, and backtracks for hours on a pattern such as (.|.){30}Q while
# holding the GIL; the regex module takes a timeout, lets other threads run meanwhile, and
# backtracks far less. (A pattern per module of a 100-layer model matches in about 2.5 s.)
MATCH_BUDGET_S = 10.0
# LoraConfig.variants' names: a fixed set, so a metric may label by them without a cap.
VARIANTS = (
    "alpha_pattern", "lora_bias", "rank_pattern", "trainable_token_indices", "use_dora",
    "use_rslora",
)  # fmt: skip
_REFUSED = (  # config key, the value PEFT writes when the feature is off, what to say
    ("modules_to_save", None,
     "modules_to_save is not supported: merge those modules into the base model, or train "
     "LoRA on them instead (list them in target_modules)"),
    ("layers_pattern", None, "layer patterns (layers_pattern) are not supported"),
    ("fan_in_fan_out", False, "fan_in_fan_out weights are not supported"),
    ("use_qalora", False, "QA-LoRA (use_qalora) is not supported"),
    ("layer_replication", None, "layer_replication is not supported"),
)  # fmt: skip


@dataclass(frozen=True)
class LoraConfig:
    """The served fields of a PEFT LoRA config."""

    rank: int
    alpha: float
    use_rslora: bool = False
    use_dora: bool = False
    lora_bias: bool = False
    rank_pattern: Mapping[str, int] = field(default_factory=dict)
    alpha_pattern: Mapping[str, float] = field(default_factory=dict)
    base_model_name: str | None = None
    token_indices: tuple[
        int, ...
    ] = ()  # trainable_token_indices (adapters.format.trainable_tokens)
    targets: Targets = field(default_factory=Targets)  # the modules PEFT puts LoRA on
    # parameters PEFT puts LoRA on (a mixture of experts' stacked ones: expert_modules)
    target_parameters: tuple[str, ...] = ()
    _matches: _Matches = field(default_factory=lambda: _Matches(), init=False, compare=False,
                               repr=False)  # fmt: skip

    def selects(self, name: str) -> bool:
        """Whether PEFT puts LoRA on the module named `name` (adapters.format.peft_targets)."""
        return self.targets.selects(name, self._matches.full)

    def selects_parameter(self, key: str) -> bool:
        """Whether target_parameters names the parameter `key` (model.layers.0.mlp.gate.weight):
        it is an entry or ends with "." + an entry, as PEFT matches it."""
        return any(key == t or key.endswith("." + t) for t in self.target_parameters)

    def rank_of(self, name: str) -> int:
        """The rank of the module named `name` in the model (rank_pattern, else r)."""
        key = self._matches.key("rank_pattern", self.rank_pattern, name)
        return self.rank_pattern.get(key, self.rank)

    def scale_of(self, name: str) -> float:
        """The module's scale: alpha / r, or alpha / sqrt(r) with rsLoRA, each its own."""
        rank = self.rank_of(name)
        key = self._matches.key("alpha_pattern", self.alpha_pattern, name)
        alpha = self.alpha_pattern.get(key, self.alpha)
        return alpha / math.sqrt(rank) if self.use_rslora else alpha / rank

    @property
    def scale(self) -> float:
        """The scale of a module no pattern names."""
        return self.alpha / math.sqrt(self.rank) if self.use_rslora else self.alpha / self.rank

    @property
    def variants(self) -> tuple[str, ...]:
        """The LoRA variants the adapter uses, by their PEFT field names, sorted."""
        used = {
            "use_dora": self.use_dora,
            "rank_pattern": bool(self.rank_pattern),
            "alpha_pattern": bool(self.alpha_pattern),
            "lora_bias": self.lora_bias,
            "use_rslora": self.use_rslora,
            "trainable_token_indices": bool(self.token_indices),
        }
        return tuple(sorted(name for name, on in used.items() if on))


def parse_config(data: bytes, label: str, max_rank: int) -> LoraConfig:
    """adapter_config.json's bytes as a LoraConfig; AdapterError naming the field if refused."""
    config = parse_json(data, f"{label}: {CONFIG}", max_bytes=MAX_CONFIG_BYTES)
    if not isinstance(config, dict):
        raise AdapterError(f"{label}: {CONFIG} is not a JSON object")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise AdapterError(
            f"{label}: peft_type {shorten(peft_type)} is not supported; only LORA adapters are"
        )
    for key, off, message in _REFUSED:
        if config.get(key, off) not in (off, None, {}, [], False):
            raise AdapterError(f"{label}: {message}")
    if config.get("bias", "none") != "none":
        raise AdapterError(
            f"{label}: bias {quoted(config['bias'])} is not supported; only bias 'none' is "
            "(a bias on lora_B is lora_bias, which is)"
        )
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not _is_int(rank) or rank < 1:
        raise AdapterError(f"{label}: r must be a positive integer, got {quoted(rank)}")
    if not _is_number(alpha):
        raise AdapterError(f"{label}: lora_alpha must be a number, got {quoted(alpha)}")
    if _flag(config, "use_dora", label) and _flag(config, "lora_bias", label):
        raise AdapterError(
            f"{label}: lora_bias with use_dora is not supported (PEFT refuses to train it too)"
        )
    ranks = _patterns(config, "rank_pattern", label, _is_int, "a positive integer")
    for key, r in (("r", rank), *((f"rank_pattern[{quoted(k)}]", v) for k, v in ranks.items())):
        if r < 1:
            raise AdapterError(f"{label}: {key} must be a positive integer, got {r}")
        if r > max_rank:
            raise AdapterError(f"{label}: {key}: rank {r} is above lora.max_lora_rank ({max_rank})")
    alphas = _patterns(config, "alpha_pattern", label, _is_number, "a number")
    trained_on = config.get("base_model_name_or_path")
    return LoraConfig(
        rank=rank,
        alpha=float(alpha),
        use_rslora=_flag(config, "use_rslora", label),
        use_dora=_flag(config, "use_dora", label),
        lora_bias=_flag(config, "lora_bias", label),
        rank_pattern=ranks,
        alpha_pattern={k: float(v) for k, v in alphas.items()},
        base_model_name=trained_on if isinstance(trained_on, str) else None,
        token_indices=token_indices(config, label),
        targets=parse_targets(config, label),
        target_parameters=_parameters(config, label),
    )


def _parameters(config: dict, label: str) -> tuple[str, ...]:
    """target_parameters: a list of parameter names (e.g. mlp.experts.gate_up_proj)."""
    names = config.get("target_parameters") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise AdapterError(f"{label}: target_parameters must be a list of parameter names")
    if len(names) > MAX_PATTERNS:
        raise AdapterError(f"{label}: target_parameters has more than {MAX_PATTERNS} entries")
    return tuple(names)


def _patterns(config: dict, key: str, label: str, valid, what: str) -> dict:
    """A rank or alpha pattern: {regex: value}, each regex compiled once here to check it."""
    patterns = config.get(key) or {}
    if not isinstance(patterns, dict):
        raise AdapterError(f"{label}: {key} must be an object of module pattern -> value")
    if len(patterns) > MAX_PATTERNS:
        raise AdapterError(f"{label}: {key} has {len(patterns)} entries, more than {MAX_PATTERNS}")
    for pattern, value in patterns.items():
        if len(pattern) > MAX_PATTERN_CHARS:
            raise AdapterError(
                f"{label}: {key}: pattern {shorten(pattern)} is longer than {MAX_PATTERN_CHARS}"
            )
        try:
            regex.compile(pattern)
        except regex.error as exc:
            raise AdapterError(
                f"{label}: {key}: pattern {quoted(pattern)} is not a valid regex ({exc})"
            ) from None
        if not valid(value):
            raise AdapterError(
                f"{label}: {key}[{quoted(pattern)}] must be {what}, got {quoted(value)}"
            )
    return dict(patterns)


_PLAIN = regex.compile(r"[A-Za-z0-9_]+")


class _Matches:
    """The pattern key of each module name, found once per config, within MATCH_BUDGET_S."""

    def __init__(self) -> None:
        self._found: dict[tuple[str, str], str | None] = {}
        self._compiled: dict[str, regex.Pattern] = {}  # a config may hold thousands of keys
        self._left_s = MATCH_BUDGET_S

    def key(self, table: str, patterns: Mapping[str, object], name: str) -> str | None:
        """PEFT's rule: the first key k of patterns for which `(.*\\.)?(k)$` matches name."""
        if not patterns:
            return None
        if (table, name) not in self._found:
            self._found[table, name] = self._first(table, patterns, name)
        return self._found[table, name]

    def _first(self, table: str, patterns: Mapping[str, object], name: str) -> str | None:
        for key in patterns:
            if _PLAIN.fullmatch(key):  # a module's own name: no regex needed
                if name == key or name.endswith("." + key):
                    return key
                continue
            if self._timed(table, key, rf"(.*\.)?({key})$", name, full=False):
                return key
        return None

    def full(self, table: str, pattern: str, name: str) -> bool:
        """Whether the whole of name matches the regex pattern (a target/exclude string)."""
        if (table, name) not in self._found:
            hit = self._timed(table, pattern, pattern, name, full=True)
            self._found[table, name] = pattern if hit else None
        return self._found[table, name] is not None

    def _timed(self, table: str, key: str, source: str, name: str, *, full: bool) -> bool:
        began = time.monotonic()
        try:
            if self._left_s <= 0:
                raise TimeoutError
            pattern = self._compiled.get(source)
            if pattern is None:
                pattern = self._compiled[source] = regex.compile(source)
            # concurrent: other threads (the server's event loop) run while it matches
            match = pattern.fullmatch if full else pattern.match
            return match(name, timeout=max(self._left_s, 1e-3), concurrent=True) is not None
        except TimeoutError:
            raise AdapterError(
                f"{table}: matching the model's module names took over {MATCH_BUDGET_S:g} s "
                f"(pattern {quoted(key)}); name modules plainly, as PEFT writes them "
                f"('q_proj', 'model.layers.3.self_attn.q_proj')"
            ) from None
        finally:
            self._left_s -= time.monotonic() - began


def _flag(config: dict, key: str, label: str) -> bool:
    value = config.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise AdapterError(f"{label}: {key} must be true or false, got {quoted(value)}")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """A finite number that a float holds (JSON's integers have no bound)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past float's range
        return False
