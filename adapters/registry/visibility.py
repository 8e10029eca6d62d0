"""Who may use and who may change which adapter: the one rule every caller goes through.

A caller of tenant T, user or admin alike, generates with T's own adapter of a name if T
has one, else with the public adapter of that name, else with none: another tenant's
private adapter answers exactly as a missing one does, so it cannot be told apart.
Changing or deleting is narrower: a user key manages its own tenant's names only; an
admin may name any owner, and without one manages its own tenant's. A public adapter of
another tenant is visible to a user but not its to change (NotOwner), and an admin changes
it only by naming its owner: `delete upper` from an admin key must not take away the
operator's `upper` that every tenant uses.
"""

from __future__ import annotations

from adapters.errors import AdapterError, NotOwner, UnknownAdapter
from adapters.registry.names import parse_ref, validate_tenant
from adapters.registry.records import Entry, Version
from adapters.registry.registry import Registry
from adapters.registry.staged import Staged


def visible_owner(registry: Registry, tenant: str, name: str) -> str:
    """Whose adapter name is to a caller of tenant: tenant's own, else the public one's owner."""
    # exists(), not a listing: a damaged own name is reported, never passed over for the public one.
    if registry.exists(name, tenant):
        return tenant
    owner = registry.public_owner(name)
    if owner is None:
        raise UnknownAdapter.for_name(name)
    return owner


def resolve_for(registry: Registry, tenant: str, ref: str) -> Version:
    """'name' or 'name@digest' as a caller of tenant sees it: its own name, else the public one."""
    if not isinstance(ref, str):
        return registry.resolve(ref, tenant)  # which refuses it, naming the problem
    name, _ = parse_ref(ref)
    return registry.resolve(ref, visible_owner(registry, tenant, name))


def visible_entry(
    registry: Registry, tenant: str, is_admin: bool, name: str, owner: str | None = None
) -> Entry:
    """The entry a caller of tenant reads as name: tenant's own, else the public one. An admin
    naming owner reads owner's; a user naming another owner is answered as for a missing name."""
    validate_tenant(tenant)
    if is_admin and owner is not None:
        return registry.show(name, validate_tenant(owner))
    if owner not in (None, tenant):
        raise UnknownAdapter.for_name(name)
    return registry.show(name, visible_owner(registry, tenant, name))


def manageable(
    registry: Registry, tenant: str, is_admin: bool, name: str, owner: str | None = None
) -> Entry:
    """The entry a caller of tenant may change or delete: owner's name, or (owner None)
    tenant's own. A user names no owner but its own tenant, and a public adapter of another
    tenant is NotOwner; an admin may manage any, naming its owner when it is not its own."""
    validate_tenant(tenant)
    target = tenant if owner is None else validate_tenant(owner)
    if (is_admin or target == tenant) and registry.exists(name, target):
        return registry.show(name, target)
    # Found as the read path finds it, so what an admin can read it can manage.
    public_owner = registry.public_owner(name)
    if public_owner in (None, tenant) or owner not in (None, public_owner):
        raise UnknownAdapter.for_name(name)
    if not is_admin:
        raise NotOwner(
            f"adapter {name!r} is public and belongs to another tenant; "
            "only its owner or an admin can change it"
        )
    if owner is None:
        raise AdapterError(
            f"adapter {name!r} is the public adapter of tenant {public_owner!r}, not of this "
            f"key's tenant {tenant!r}: name its owner to change it (?tenant={public_owner}, "
            f"or --tenant {public_owner})"
        )
    return registry.show(name, public_owner)


def visible_staged(registry: Registry, tenant: str, staged_id: str) -> Staged | None:
    """The staged adapter (a finetune) of this id as a caller of tenant sees it: its own in
    any state, another tenant's once published to a name that is public; else None, for
    admins too, as for names."""
    staged = registry.staged.get(staged_id)
    if staged is None or staged.owner == tenant:
        return staged
    if staged.published and registry.public_owner(staged.name) == staged.owner:
        return staged
    return None
