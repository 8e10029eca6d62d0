"""Who a batch item runs as: the submitting key's holder as the keys stand when it runs."""

from serving.api.batch.items import item_caller
from serving.api.core.caller import Principal, key_id
from serving.api.edge.keys import KeyRing
from serving.batch.records import Item

ACME_USER, ACME_ADMIN = (
    Principal("acme", "user", key_id("k1")),
    Principal("acme", "admin", key_id("k2")),
)


def item(key: str, tenant: str = "acme") -> Item:
    return Item("batch_1", 0, tenant, key_id(key), "demo", "/ai/run", {"prompt": "x"})


def test_an_item_runs_as_its_keys_holder_with_the_keys_scope():
    ring = KeyRing({"k1": ACME_USER, "k2": ACME_ADMIN})
    assert item_caller(ring, item("k1")) == ACME_USER
    assert item_caller(ring, item("k2")).is_admin


def test_a_revoked_key_or_a_key_moved_to_another_tenant_runs_nothing():
    ring = KeyRing({"k1": ACME_USER})
    assert item_caller(ring, item("gone")) is None
    assert item_caller(ring, item("k1", tenant="globex")) is None


def test_a_keyless_server_runs_items_as_its_one_admin():
    caller = item_caller(KeyRing({}), item("open", tenant="default"))
    assert caller.tenant == "default" and caller.is_admin
