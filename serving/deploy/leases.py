"""A replica's lease on the adapter versions it holds, so `loraserve adapters gc` keeps them.

Versions are immutable and a replica may load one again after evicting it, even after its
name was deleted. Every LEASE_PERIOD_S a thread writes the digests in this replica's slab
slots to the registry's leases/ (Registry.write_lease); gc keeps any version a lease
refreshed within its TTL lists, and the lease is dropped when the replica stops.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid

from adapters.registry.names import version_digest
from adapters.registry.registry import Registry
from adapters.slab.slab import AdapterSlab

LEASE_PERIOD_S = 60.0  # well inside gc's default lease TTL of 600 s
log = logging.getLogger("loraserve.deploy")


class Leases:
    """Refreshes this replica's lease until close()."""

    def __init__(self, registry: Registry, slab: AdapterSlab | None) -> None:
        self.registry, self.slab = registry, slab
        self.holder = f"replica-{uuid.uuid4().hex[:12]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="adapter-leases", daemon=True)
        if slab is not None:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(LEASE_PERIOD_S):
            try:
                digests = sorted({version_digest(v) for v in self.slab.residents()})
                self.registry.write_lease(self.holder, digests)
            except Exception as exc:
                log.warning("could not renew the adapter lease %s: %s", self.holder, exc)

    def close(self) -> None:
        """Stop renewing and drop the lease (best effort: it expires anyway)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self.slab is not None:
            with contextlib.suppress(Exception):
                self.registry.drop_lease(self.holder)
