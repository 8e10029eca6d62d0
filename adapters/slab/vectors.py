"""The slab's per-output vectors: lora_B biases (lora_bias) and DoRA's output scales.

Per layer and module, beside A and B, per page of the slab (an adapter's are at its slot,
its first page; its other pages' are never read, as no token names them):

    bias[num_pages, out]   scale * lora_B.bias, added to the rows of the slot's tokens
    dora[num_pages, out]   g = m / ||W + scale * B @ A||_row, which multiplies those rows

and per slot whether it has either, so a step finds the rows that need them and leaves
every other row (base, plain LoRA) untouched. g is computed once, at load, from the weights
this replica serves (`base_weight`: the dequantized FP8 weight where the base is FP8), so
the norm is of the matrix the output is actually computed with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from adapters.errors import AdapterError
from adapters.format.adapter import Adapter
from adapters.format.lora_modules import LoraModule

Key = tuple[int, str]  # (layer, module)
BaseWeight = Callable[[int, str], torch.Tensor]  # (layer, module) -> W [out, in] as served


class SlabVectors:
    """bias and dora stacks for every (layer, module), and which slots use them."""

    def __init__(
        self,
        shapes: Iterable[tuple[Key, int]],
        num_pages: int,
        *,
        base_weight: BaseWeight | None,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        like = {"dtype": dtype, "device": device}
        self.base_weight = base_weight
        self.bias: dict[Key, torch.Tensor] = {}
        self.dora: dict[Key, torch.Tensor] = {}
        for key, fan_out in shapes:
            self.bias[key] = torch.zeros(num_pages, fan_out, **like)
            self.dora[key] = torch.ones(num_pages, fan_out, **like)
        # [num_pages] bool each: the step's row selection reads them on the device
        self.has_bias = torch.zeros(num_pages, dtype=torch.bool, device=device)
        self.has_dora = torch.zeros(num_pages, dtype=torch.bool, device=device)
        self._written: set[int] = set()  # slots whose vectors may differ from 0 and 1
        self.num_bias = self.num_dora = 0  # slots set in each, read on the host per step
        # The same flags as lists: a step picks its rows on the host, with no read-back.
        self.host_bias, self.host_dora = [False] * num_pages, [False] * num_pages

    def check(self, version: str, adapter: Adapter) -> None:
        """AdapterError if the slab cannot serve the adapter's DoRA (no base weights)."""
        if self.base_weight is None and any(
            m.magnitude is not None for m in adapter.modules.values()
        ):
            raise AdapterError(
                f"adapter {version}: uses DoRA, which this slab cannot serve: it was built "
                "without the base model's weights"
            )

    def write(self, slot: int, adapter: Adapter) -> None:
        """Fill slot's vectors from adapter (zeros and ones where it has none)."""
        wanted = any(
            m.bias is not None or m.magnitude is not None for m in adapter.modules.values()
        )
        if not wanted and slot not in self._written:
            return  # its vectors are zeros and ones already: a plain LoRA writes none
        self._written.discard(slot)
        if wanted:
            self._written.add(slot)
        for key, bias in self.bias.items():
            mod = adapter.modules.get(key)
            if mod is None or mod.bias is None:
                bias[slot].zero_()
            else:
                bias[slot].copy_(mod.scale * mod.bias.to(torch.float32))
            dora = self.dora[key]
            if mod is None or mod.magnitude is None:
                dora[slot].fill_(1.0)
            else:
                dora[slot].copy_(self._output_scale(key, mod))

    def mark(self, slot: int, adapter: Adapter | None) -> None:
        """Record whether slot's adapter (None: an empty slot) has biases or DoRA."""
        modules = adapter.modules.values() if adapter is not None else ()
        for flags, host, wanted in (
            (self.has_bias, self.host_bias, any(m.bias is not None for m in modules)),
            (self.has_dora, self.host_dora, any(m.magnitude is not None for m in modules)),
        ):
            if host[slot] != wanted:  # else nothing changes: no device write
                flags[slot] = host[slot] = wanted
        self.num_bias, self.num_dora = self.host_bias.count(True), self.host_dora.count(True)

    def _output_scale(self, key: Key, mod: LoraModule) -> torch.Tensor:
        """g = m / ||W + scale * B @ A|| per output row, in float32: [out]."""
        w = self.base_weight(*key).to(torch.float32)  # [out, in]
        delta = mod.b.to(w.device, torch.float32) @ mod.a.to(w.device, torch.float32)
        norm = torch.linalg.vector_norm(w + mod.scale * delta, dim=1)  # [out]
        return mod.magnitude.to(w.device, torch.float32) / norm
