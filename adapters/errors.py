"""The one error type of the adapters package: its message names the problem for a user."""


class AdapterError(ValueError):
    """An adapter, a name or a registry request that cannot be accepted; nothing was stored."""


def quoted(value: object, limit: int = 120) -> str:
    """repr(value) cut to about `limit` characters, for echoing untrusted input in a message."""
    return shorten(repr(value), limit)


def shorten(text: str, limit: int = 120) -> str:
    """text cut to about `limit` characters."""
    # A hostile tensor name or config value can be megabytes; a message should stay a line.
    return text if len(text) <= limit else f"{text[:limit]}…"
