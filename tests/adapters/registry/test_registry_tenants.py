"""Tenants' namespaces, the public index and the visibility rule (adapters.registry.visibility)."""

from __future__ import annotations

import pytest

from adapters.errors import AdapterError, NameConflict, NotOwner, UnknownAdapter
from adapters.registry.registry import Registry
from adapters.registry.visibility import manageable, resolve_for, visible_entry
from tests.adapters.registry.helpers import assert_consistent, assert_same_adapter, make_adapter


@pytest.fixture
def reg(uri):
    """acme and globex each own support-bot, with different content; acme also owns sql."""
    reg = Registry(uri)
    reg.publish("support-bot", make_adapter(seed=1), owner="acme")
    reg.publish("support-bot", make_adapter(seed=2), owner="globex")
    reg.publish("sql", make_adapter(seed=3), owner="acme")
    return reg


def test_each_tenant_owns_its_name(reg, uri):
    acme, globex = reg.resolve("support-bot", "acme"), reg.resolve("support-bot", "globex")
    assert (acme.owner, acme.digest) == ("acme", make_adapter(seed=1).digest)
    assert (globex.owner, globex.digest) == ("globex", make_adapter(seed=2).digest)
    assert acme.ref == f"support-bot@{acme.digest}"
    assert acme.qualified == f"acme/support-bot@{acme.digest}"
    assert_same_adapter(reg.load(acme.qualified), make_adapter(seed=1))
    assert_same_adapter(reg.load(globex.qualified), make_adapter(seed=2))
    # A version of one tenant's name is not a version of the other's.
    with pytest.raises(UnknownAdapter, match="unknown version"):
        reg.resolve(globex.ref, "acme")
    assert [(e.name, e.owner) for e in reg.list()] == [
        ("sql", "acme"),
        ("support-bot", "acme"),
        ("support-bot", "globex"),
    ]
    assert [e.name for e in reg.list("acme")] == ["sql", "support-bot"]
    assert [e.digest for e in reg.list("globex")] == [globex.digest]
    assert reg.list("initech") == []
    assert not reg.exists("sql", "globex")
    with pytest.raises(UnknownAdapter, match="unknown adapter 'sql'"):
        reg.resolve("sql", "globex")
    reg.delete("support-bot", "globex")
    assert reg.resolve("support-bot", "acme") == acme
    assert_consistent(uri)


def test_public(reg):
    assert reg.public_owner("support-bot") is None
    entry = reg.set_public("support-bot", "acme", True)
    assert entry.public and entry.owner == "acme"
    assert reg.public_owner("support-bot") == "acme"
    assert reg.resolve("support-bot", "acme").public
    assert not reg.resolve("support-bot", "globex").public
    assert [(e.owner, e.public) for e in reg.list() if e.name == "support-bot"] == [
        ("acme", True),
        ("globex", False),
    ]
    assert reg.show("support-bot", "acme").public
    # Setting it again is a no-op; another tenant cannot take the public name.
    assert reg.set_public("support-bot", "acme", True).public
    with pytest.raises(NameConflict, match="already public"):
        reg.set_public("support-bot", "globex", True)
    with pytest.raises(UnknownAdapter, match="unknown adapter 'nope'"):
        reg.set_public("nope", "acme", True)
    # Unmarking someone else's does nothing; the owner's own unmarking frees the name.
    reg.set_public("support-bot", "globex", False)
    assert reg.public_owner("support-bot") == "acme"
    assert not reg.set_public("support-bot", "acme", False).public
    assert reg.public_owner("support-bot") is None
    assert reg.set_public("support-bot", "globex", True).public


def test_delete_removes_the_public_entry(reg):
    reg.set_public("sql", "acme", True)
    reg.delete("sql", "acme")
    assert reg.public_owner("sql") is None
    # A new adapter of that name starts private.
    reg.publish("sql", make_adapter(seed=4), owner="acme")
    assert reg.public_owner("sql") is None and not reg.resolve("sql", "acme").public


def test_list_visible(reg):
    reg.publish("summarize", make_adapter(seed=5), owner="globex")
    reg.set_public("summarize", "globex", True)
    reg.set_public("sql", "acme", True)
    assert [(e.name, e.owner) for e in reg.list_visible("acme")] == [
        ("sql", "acme"),
        ("summarize", "globex"),
        ("support-bot", "acme"),
    ]
    assert [(e.name, e.owner, e.public) for e in reg.list_visible("initech")] == [
        ("sql", "acme", True),
        ("summarize", "globex", True),
    ]


def test_resolve_for_prefers_own_then_public(reg):
    assert resolve_for(reg, "acme", "support-bot").owner == "acme"
    assert resolve_for(reg, "globex", "support-bot").owner == "globex"
    with pytest.raises(UnknownAdapter):
        resolve_for(reg, "globex", "sql")
    reg.set_public("sql", "acme", True)
    sql = reg.resolve("sql", "acme")
    assert sql.public and resolve_for(reg, "globex", "sql") == sql
    assert resolve_for(reg, "globex", sql.ref) == sql
    reg.set_public("support-bot", "acme", True)
    # globex's own support-bot still wins over acme's public one.
    assert resolve_for(reg, "globex", "support-bot").owner == "globex"
    assert resolve_for(reg, "initech", "support-bot").owner == "acme"


def test_a_private_adapter_of_another_tenant_reads_as_missing(reg):
    sql = reg.resolve("sql", "acme")
    hidden = ["sql", sql.ref]
    for ref in hidden:
        with pytest.raises(UnknownAdapter) as got:
            resolve_for(reg, "globex", ref)
        with pytest.raises(UnknownAdapter) as missing:
            resolve_for(reg, "globex", ref.replace("sql", "nosuch"))
        assert str(got.value) == str(missing.value).replace("nosuch", "sql")
        assert type(got.value) is type(missing.value)


def test_manageable(reg):
    reg.set_public("sql", "acme", True)
    own = manageable(reg, "acme", False, "sql")
    assert (own.name, own.owner) == ("sql", "acme")
    assert manageable(reg, "acme", False, "sql", owner="acme") == own
    # A public adapter of another tenant is visible, but not the user's to change.
    for owner in (None, "acme"):
        with pytest.raises(NotOwner, match="'sql' is public and belongs to another tenant"):
            manageable(reg, "globex", False, "sql", owner=owner)
    # A private one of another tenant is not even there.
    for owner in (None, "acme"):
        with pytest.raises(UnknownAdapter, match=r"^unknown adapter 'support-bot'$"):
            manageable(reg, "initech", False, "support-bot", owner=owner)
    with pytest.raises(UnknownAdapter, match="unknown adapter 'support-bot'"):
        manageable(reg, "initech", False, "support-bot", owner="globex")
    # An admin names any owner; without one, its own tenant.
    assert manageable(reg, "ops", True, "support-bot", owner="globex").owner == "globex"
    assert manageable(reg, "acme", True, "support-bot").owner == "acme"
    with pytest.raises(UnknownAdapter):
        manageable(reg, "ops", True, "support-bot")


def test_list_visible_shows_a_tenants_own_name_over_a_public_one(reg):
    reg.set_public("support-bot", "acme", True)
    assert [(e.name, e.owner) for e in reg.list_visible("globex")] == [("support-bot", "globex")]
    assert [(e.name, e.owner) for e in reg.list_visible("initech")] == [("support-bot", "acme")]


def test_an_admin_names_the_owner_of_a_public_adapter_it_changes(reg):
    """An admin reads another tenant's public adapter by its name alone, but changes it only
    naming its owner: a delete meant for its own tenant must not take everyone's away."""
    reg.set_public("sql", "acme", True)
    assert visible_entry(reg, "ops", True, "sql").owner == "acme"
    with pytest.raises(AdapterError, match=r"public adapter of tenant 'acme'.*\?tenant=acme"):
        manageable(reg, "ops", True, "sql")
    entry = manageable(reg, "ops", True, "sql", owner="acme")
    assert (entry.name, entry.owner, entry.public) == ("sql", "acme", True)
    # The admin's own tenant's name comes first; another owner is named explicitly.
    reg.publish("sql", make_adapter(seed=6), owner="ops")
    assert manageable(reg, "ops", True, "sql").owner == "ops"
    assert manageable(reg, "ops", True, "sql", owner="acme").owner == "acme"
    with pytest.raises(UnknownAdapter, match=r"^unknown adapter 'sql'$"):
        manageable(reg, "initech", True, "sql", owner="globex")
    with pytest.raises(NotOwner):
        manageable(reg, "initech", False, "sql")


def test_visible_entry(reg):
    reg.set_public("sql", "acme", True)
    assert visible_entry(reg, "acme", False, "support-bot").owner == "acme"
    assert visible_entry(reg, "globex", False, "support-bot", owner="globex").owner == "globex"
    assert visible_entry(reg, "initech", False, "sql").owner == "acme"
    assert visible_entry(reg, "ops", True, "support-bot", owner="globex").owner == "globex"
    # Naming another owner, or a private name of another tenant, reads as missing.
    for owner in ("globex", "acme", "nosuch"):
        with pytest.raises(UnknownAdapter, match=r"^unknown adapter 'support-bot'$"):
            visible_entry(reg, "initech", False, "support-bot", owner=owner)
    with pytest.raises(UnknownAdapter, match=r"^unknown adapter 'sql'$"):
        visible_entry(reg, "globex", False, "sql", owner="acme")
    for tenant, is_admin in (("initech", False), ("ops", True)):
        with pytest.raises(UnknownAdapter, match=r"^unknown adapter 'support-bot'$"):
            visible_entry(reg, tenant, is_admin, "support-bot")
    with pytest.raises(UnknownAdapter):
        visible_entry(reg, "ops", True, "sql", owner="globex")
