"""OCDBT interoperability with TensorStore's own S3 driver on the same S3 server: we read what
TensorStore wrote, TensorStore reads what we wrote, and alternating commits from both
libraries to one database on S3 all survive."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import ocdbt_py
from ocdbt_py.maintenance.verify import verify
from tests.objectstores import servers

ts = pytest.importorskip("tensorstore")

BUCKET = "ocdbt-ts"
_n = itertools.count()


@pytest.fixture
def s3(s3_server: servers.S3Server, monkeypatch: pytest.MonkeyPatch) -> servers.S3Server:
    s3_server.make_bucket(BUCKET)
    for k, v in s3_server.env().items():  # TensorStore takes static credentials from here
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return s3_server


def _ts_kv(srv: servers.S3Server, path: str, **config: Any) -> Any:
    spec: dict[str, Any] = {
        "driver": "ocdbt",
        "base": {"driver": "s3", "bucket": BUCKET, "path": path + "/", "endpoint": srv.endpoint,
                 "aws_region": servers.S3_REGION},
    }
    if config:
        spec["config"] = config
    return ts.KvStore.open(spec).result()


def _values() -> dict[bytes, bytes]:
    vals = {b"small/%04d" % i: b"v%d" % i for i in range(300)}
    vals.update({b"big/%02d" % i: bytes([i]) * (20000 + i) for i in range(12)})
    return vals


def test_read_tensorstore_database_on_s3(s3: servers.S3Server) -> None:
    path = f"tsdb{next(_n)}"
    kv = _ts_kv(s3, path, max_inline_value_bytes=100, max_decoded_node_bytes=4096)
    vals = _values()
    items = list(vals.items())
    for lo in range(0, len(items), 100):  # several generations
        txn = ts.Transaction(atomic=True)
        kvt = kv.with_transaction(txn)
        for k, v in items[lo : lo + 100]:
            kvt[k] = v
        txn.commit_sync()
    url = f"s3://{BUCKET}/{path}"
    db = ocdbt_py.open(url, storage_options=s3.storage_options())
    assert db.generation == 5
    assert list(db.list()) == sorted(vals)
    keys = sorted(vals)
    assert db.get_many(keys) == [vals[k] for k in keys]
    assert db.at(2).get(b"small/0000") == b"v0" and db.at(2).get(b"small/0150") is None
    report = verify(url, storage_options=s3.storage_options())
    assert report.ok, report.format()


def test_tensorstore_reads_our_database_on_s3(s3: servers.S3Server) -> None:
    path = f"ourdb{next(_n)}"
    url = f"s3://{BUCKET}/{path}"
    db = ocdbt_py.open(url, mode="a", storage_options=s3.storage_options(),
                       config={"max_inline_value_bytes": 100, "max_decoded_node_bytes": 4096})
    vals = _values()
    items = list(vals.items())
    for lo in range(0, len(items), 100):
        with db.transaction() as t:
            for k, v in items[lo : lo + 100]:
                t.put(k, v)
    kv = _ts_kv(s3, path)
    assert sorted(bytes(k) for k in kv.list().result()) == sorted(vals)  # TensorStore lists unordered
    for k in sorted(vals)[::7]:
        assert kv.read(k).result().value == vals[k]


def test_alternating_commits_from_both_libraries(s3: servers.S3Server) -> None:
    path = f"mixed{next(_n)}"
    url = f"s3://{BUCKET}/{path}"
    kv = _ts_kv(s3, path, max_inline_value_bytes=16)
    kv[b"ts/000"] = b"from tensorstore 0"  # TensorStore creates the database
    db = ocdbt_py.open(url, mode="a", storage_options=s3.storage_options())
    for i in range(1, 6):
        db.put(b"py/%03d" % i, b"from ocdbt-py %d" % i)
        kv[b"ts/%03d" % i] = b"from tensorstore %d" % i
    db.refresh()
    assert db.generation == 12
    want = {b"ts/%03d" % i: b"from tensorstore %d" % i for i in range(6)}
    want.update({b"py/%03d" % i: b"from ocdbt-py %d" % i for i in range(1, 6)})
    assert dict(db.items()) == want
    assert {bytes(k) for k in kv.list().result()} == set(want)
