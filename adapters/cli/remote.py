"""The adapter catalogue of a running loraserve server, over its HTTP API (/v1/adapters).

The bearer key comes from LORASERVE_API_KEY and its tenant is the namespace; `tenant`
names another one (`?tenant=`, or the form field on upload), which the server allows
admin keys only. Every failure raises RemoteError with one line to show: the server's
own error message, why the server could not be reached, or what is wrong with its URL or
the key.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from urllib.parse import quote

from adapters.cli.http_json import RemoteError, call_json, open_client, server_url
from adapters.format.adapter import Adapter
from adapters.format.sources import CONFIG, WEIGHTS
from adapters.registry.records import Entry


class RemoteCatalogue:
    """Upload, list, show, delete and mark public adapters on the server at url.

    The methods mirror Registry's: `tenant` None is the key's own tenant.
    """

    def __init__(self, url: str, key: str | None = None) -> None:
        """RemoteError, before any request, if url or the key is malformed."""
        self.url = server_url(url)
        self._client, self.key = open_client(self.url, key)

    def upload(
        self,
        name: str,
        adapter: Adapter,
        progress: Callable[[int], None] | None = None,
        tenant: str | None = None,
    ) -> dict:
        """Send a validated adapter's files; returns the server's version record."""
        parts = [(CONFIG, adapter.config_bytes), (WEIGHTS, adapter.weights_bytes)]
        if adapter.draft is not None:
            parts += [
                (f"draft_{CONFIG}", adapter.draft.config_bytes),
                (f"draft_{WEIGHTS}", adapter.draft.weights_bytes),
            ]
        files = {
            field: (field, _Counted(data, progress), "application/octet-stream")
            for field, data in parts
        }
        form = {"name": name} if tenant is None else {"name": name, "tenant": tenant}
        return self._call("POST", "/v1/adapters", data=form, files=files)

    def list(self, tenant: str | None = None) -> list[Entry]:
        """The adapters this key may see (an admin key: every tenant's, or tenant's)."""
        body = self._call("GET", "/v1/adapters", params=_query(tenant))
        return [_entry(e) for e in body["data"]]

    def show(self, name: str, tenant: str | None = None) -> Entry:
        """One adapter with its history."""
        return _entry(self._call("GET", _path(name), params=_query(tenant)))

    def delete(self, name: str, tenant: str | None = None) -> None:
        self._call("DELETE", _path(name), params=_query(tenant))

    def set_public(self, name: str, tenant: str | None, public: bool) -> Entry:
        """Make name usable by every tenant, or private again (admin keys only)."""
        body = self._call("PATCH", _path(name), params=_query(tenant), json={"public": public})
        return _entry(body)

    def _call(self, method: str, path: str, **kwargs) -> dict:
        return call_json(self._client, method, path, key=self.key, **kwargs)


class _Counted(io.BytesIO):
    """Bytes that report how many were read, so an upload can show its progress."""

    def __init__(self, data: bytes, progress: Callable[[int], None] | None) -> None:
        super().__init__(data)
        self._progress = progress

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        if self._progress is not None and chunk:
            self._progress(len(chunk))
        return chunk


def _path(name: str) -> str:
    return f"/v1/adapters/{quote(name, safe='')}"  # a stray "/" or "?" stays in the name


def _query(tenant: str | None) -> dict[str, str]:
    return {} if tenant is None else {"tenant": tenant}


def _entry(data: dict) -> Entry:
    try:
        return Entry(
            name=data["name"],
            digest=data["digest"],
            owner=data["owner"],
            updated=data["updated"],
            rank=data["rank"],
            target_modules=tuple(data["target_modules"]),
            num_bytes=data["num_bytes"],
            history=tuple(data.get("history", ())),
            public=bool(data.get("public", False)),  # absent from servers without tenants
            variants=tuple(data.get("variants", ())),  # absent from servers before variants
        )
    except (KeyError, TypeError) as exc:
        raise RemoteError(f"unexpected answer from the server: missing {exc}") from None
