"""The adapters package's errors: AdapterError and the typed cases callers act on.

Every message names the problem for a user. Callers decide by type (404, 409, 403, 503
upstream), never by the words of a message.
"""


class AdapterError(ValueError):
    """An adapter, a name or a registry request that cannot be accepted; nothing was stored."""


class UnknownAdapter(AdapterError):
    """The adapter or version does not exist, or the caller may not see it (the same answer)."""

    @classmethod
    def for_name(cls, name: str) -> "UnknownAdapter":
        """The one message for a name that is absent or hidden from the caller."""
        return cls(f"unknown adapter {name!r}")

    @classmethod
    def for_version(cls, name: str, digest: str) -> "UnknownAdapter":
        """A version the caller's name never pointed to."""
        return cls(f"unknown version {digest} of adapter {name!r}")


class NameConflict(AdapterError):
    """A create lost a race for a new name, or a public name is taken by another tenant."""


class NotOwner(AdapterError):
    """A public adapter of another tenant: the caller sees it but may not change it."""


class RegistryCorrupt(AdapterError):
    """A stored record or file is damaged: the server's fault, not the request's; the message
    may name paths, for the log."""


class RegistryUnavailable(AdapterError):
    """The registry's storage failed (an OSError); the message may name paths, for the log."""


def quoted(value: object, limit: int = 120) -> str:
    """repr(value) cut to about `limit` characters, for echoing untrusted input in a message."""
    return shorten(repr(value), limit)


def shorten(text: str, limit: int = 120) -> str:
    """text cut to about `limit` characters."""
    # A hostile tensor name or config value can be megabytes; a message should stay a line.
    return text if len(text) <= limit else f"{text[:limit]}…"
