"""The outbox a process keeps usage records in while the Tenancy cannot take them: durable and
0600, taken by setting the spool aside so records kept meanwhile are never lost, its files
deleted only once sent; beside the store where its folder is here, else a private temp one."""

import fcntl
import os
import stat
import tempfile
import threading

import pytest

from serving.usage.outbox import OUTBOX_FILE, Outbox, outbox_for, with_id
from tests.serving.usage.test_store import _rec


def test_records_kept_are_taken_oldest_first_and_gone_once_sent(tmp_path):
    box = Outbox(str(tmp_path / OUTBOX_FILE))
    first, second = with_id(_rec()), with_id(_rec(tenant="globex"))
    assert not box.waiting()
    box.keep([first])
    assert stat.S_IMODE(os.stat(box.path).st_mode) == 0o600 and box.waiting()
    ((path, records),) = box.take()
    assert records == [first] and not os.path.exists(box.path)  # set aside
    box.keep([second])  # while the first file is being sent: a new spool
    assert [records for _, records in box.take()] == [[first], [second]]  # not sent: again
    box.sent(path)
    assert [records for _, records in box.take()] == [[second]]
    for path, _ in box.take():
        box.sent(path)
    assert not box.waiting() and box.take() == []


def test_a_record_needs_its_id_to_be_kept(tmp_path):
    with pytest.raises(ValueError, match="needs an id"):
        Outbox(str(tmp_path / OUTBOX_FILE)).keep([_rec()])
    assert with_id(_rec()).id != with_id(_rec()).id
    kept = with_id(_rec())
    assert with_id(kept) is kept


def test_a_keep_waiting_while_the_spool_is_set_aside_goes_to_a_new_spool(tmp_path):
    box = Outbox(str(tmp_path / OUTBOX_FILE))
    box.keep([with_id(_rec())])
    fd = os.open(box.path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process's take, between its lock and rename
    late = with_id(_rec(tenant="globex"))
    keeping = threading.Thread(target=box.keep, args=([late],))
    keeping.start()
    keeping.join(0.2)
    assert keeping.is_alive()  # it waits for the lock
    aside = f"{box.path}.0.aside"  # as set_aside names it, the older
    os.rename(box.path, aside)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    keeping.join()
    assert [r.tenant for _, records in box.take() for r in records] == ["acme", "globex"]
    with open(aside) as f:
        assert "globex" not in f.read()  # appended to the new spool, not the one set aside


def test_the_outbox_is_beside_the_store_or_in_a_private_temp_folder(tmp_path, monkeypatch):
    assert outbox_for(f"sqlite:///{tmp_path / 'usage.db'}").path == str(tmp_path / OUTBOX_FILE)
    assert outbox_for("sqlite:///:memory:") is None
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read again
    elsewhere = outbox_for("sqlite:////nonexistent-volume/usage.db")  # a worker node's view
    folder = os.path.dirname(elsewhere.path)
    assert folder == str(tmp_path / "tmp" / f"loraserve-{os.getuid()}")
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    elsewhere.keep([with_id(_rec())])
    assert outbox_for("sqlite:////nonexistent-volume/usage.db").waiting()
