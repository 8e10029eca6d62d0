"""Adapters: the PEFT LoRA format, the registry, the slab and the adapter CLI. Never imports serving."""
