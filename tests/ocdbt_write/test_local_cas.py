"""LocalStore's compare-and-swap, which the single-manifest commit relies on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ocdbt_py.errors import ConditionFailedError
from ocdbt_py.kvstore import LocalStore


def test_generation_sees_content_even_when_inode_size_and_mtime_match(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path)
    kv.set_if("m", b"AAAA", if_generation=None)
    _, gen = kv.get_with_generation("m")
    p = tmp_path / "m"
    st = os.stat(p)
    with open(p, "r+b") as f:  # same inode, same size ...
        f.write(b"BBBB")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and the same mtime
    assert os.stat(p).st_ino == st.st_ino
    with pytest.raises(ConditionFailedError):
        kv.set_if("m", b"CCCC", if_generation=gen)
    assert kv.get("m") == b"BBBB"


def test_stale_and_failed_lock_files(tmp_path: Path) -> None:
    kv = LocalStore(tmp_path)
    (tmp_path / "m.__lock").write_bytes(b"garbage left by a crashed writer" * 10)
    g = kv.set_if("m", b"v1", if_generation=None)
    assert kv.get("m") == b"v1" and not (tmp_path / "m.__lock").exists()
    with pytest.raises(ConditionFailedError):
        kv.set_if("m", b"v2", if_generation=None)
    assert not (tmp_path / "m.__lock").exists()  # removed on a failed condition
    assert kv.set_if("m", b"v2", if_generation=g) != g
    assert kv.get("m") == b"v2"
    assert list(kv.list()) == ["m"]


def test_two_store_objects_in_one_process_exclude_each_other(tmp_path: Path) -> None:
    """Locks are per open file description, so two stores in one process still exclude."""
    import threading

    a, b = LocalStore(tmp_path), LocalStore(tmp_path)
    a.set_if("c", b"0", if_generation=None)
    errors: list[BaseException] = []

    def work(kv: LocalStore) -> None:
        try:
            done = 0
            while done < 40:
                value, gen = kv.get_with_generation("c")
                assert value is not None
                try:
                    kv.set_if("c", b"%d" % (int(value) + 1), if_generation=gen)
                    done += 1
                except ConditionFailedError:
                    pass
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=work, args=(kv,)) for kv in (a, b, a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and a.get("c") == b"160"
