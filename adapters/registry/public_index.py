"""The public index: public/<name>.json names the one tenant whose adapter <name> every
tenant may use. An entry whose adapter no longer exists counts as absent."""

from __future__ import annotations

from adapters.errors import NameConflict, UnknownAdapter
from adapters.registry.catalogue import Catalogue
from adapters.registry.layout import public_file


def public_owner(catalogue: Catalogue, name: str) -> str | None:
    """The tenant whose adapter called name is public, if it still exists."""
    owner = catalogue.indexed_owner(name)
    return owner if owner is not None and catalogue.exists(owner, name) else None


def set_public(catalogue: Catalogue, name: str, owner: str, public: bool) -> None:
    """Make owner's name the public one of that name, or private again.
    NameConflict if another tenant's adapter of that name is public already."""
    store = catalogue.store
    if not catalogue.exists(owner, name):
        raise UnknownAdapter.for_name(name)
    rel, current = public_file(name), catalogue.indexed_owner(name)
    if public and current != owner:
        record = {"name": name, "owner": owner}
        # Exclusive, so two tenants making one name public at once cannot both succeed.
        if not store.create(rel, record):
            if public_owner(catalogue, name) not in (None, owner):
                raise NameConflict(f"another tenant's adapter {name!r} is already public")
            store.write_json(rel, record)  # the entry names a deleted adapter
    elif not public and current == owner:
        store.remove(rel)


def unlist(catalogue: Catalogue, name: str, owner: str) -> None:
    """Remove name's index entry if it names owner's adapter (owner deletes it)."""
    if catalogue.indexed_owner(name) == owner:
        catalogue.store.remove(public_file(name))
