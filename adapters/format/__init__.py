"""The PEFT LoRA format: reading, validating and refusing adapter files, before anything is stored or loaded."""
