"""Errors of the model runtime that reach a user: each carries one clear line of text."""


class ModelLoadError(ValueError):
    """A model folder (config, weights or tokenizer) that cannot be served as it is."""


class ChatTemplateError(ValueError):
    """A chat that the model's chat template refuses or cannot render."""
