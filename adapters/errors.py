"""The one error type of the adapters package: its message names the problem for a user."""


class AdapterError(ValueError):
    """An adapter, a name or a registry request that cannot be accepted; nothing was stored."""
