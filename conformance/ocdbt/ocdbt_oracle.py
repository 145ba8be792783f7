"""What TensorStore says a database holds, and the check that ocdbt-py reads the same.

:func:`oracle_from_tensorstore` records, through TensorStore's own reads, everything a
reader must reproduce: the config, every generation (commit time, root, statistics), the
keys and values of every generation, list/byte-range/time-travel probes and (optionally)
the decoded contents of every B+tree and version-tree node (via ``ts.ocdbt.dump``).  The
result is plain JSON, so golden fixtures store it next to the database and are checked by
:func:`check_store` where TensorStore is absent.

Bytes are hex strings.  To keep fixtures small, long values are ``"sha256:<hex>:<length>"``
and long keys ``"zlib:<base64>"``; contents are stored per generation as changes from the
previous one.
"""

from __future__ import annotations

import base64
import bisect
import datetime as _dt
import hashlib
import os
import random
import urllib.parse
import zlib
from typing import Any

import ocdbt_py
from ocdbt_py.errors import NotFoundError
from ocdbt_py.format.btree import InteriorNode, LeafNode
from ocdbt_py.format.config import MANIFEST_KIND_NUMBERED
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference
from ocdbt_py.read.node_reader import NodeReader
from ocdbt_py.timeutil import format_nanoseconds

__all__ = [
    "enc",
    "enc_key",
    "dec_key",
    "parse_location",
    "format_location",
    "oracle_from_tensorstore",
    "check_store",
    "digest_items",
    "expand_contents",
]

_SHORT = 96
FORMAT = 1


def enc(b: bytes) -> str:
    """Hex of ``b``, or a digest for long byte strings."""
    if len(b) <= _SHORT:
        return b.hex()
    return f"sha256:{hashlib.sha256(b).hexdigest()}:{len(b)}"


def enc_key(b: bytes) -> str:
    """Reversible encoding of a key: hex, or zlib + base64 for long keys."""
    if len(b) <= _SHORT:
        return b.hex()
    return "zlib:" + base64.b64encode(zlib.compress(b, 9)).decode()


def dec_key(s: str) -> bytes:
    """Inverse of :func:`enc_key`."""
    if s.startswith("zlib:"):
        return zlib.decompress(base64.b64decode(s[5:]))
    return bytes.fromhex(s)


def expand_contents(oracle: dict[str, Any]) -> dict[int, list[tuple[bytes, str]]]:
    """``generation -> [(key, encoded value)]`` in key order, from the per-generation changes."""
    state: dict[bytes, str] = {}
    out: dict[int, list[tuple[bytes, str]]] = {}
    for change in oracle["contents"]:
        for k in change["deleted"]:
            del state[dec_key(k)]
        for k, v in change["set"]:
            state[dec_key(k)] = v
        out[change["generation"]] = sorted(state.items())
    return out


def digest_items(items: list[tuple[bytes, bytes]]) -> str:
    """A digest of an ordered list of ``(key, value)`` pairs."""
    h = hashlib.sha256()
    for k, v in items:
        h.update(len(k).to_bytes(8, "little") + k + len(v).to_bytes(8, "little") + v)
    return h.hexdigest()[:16]


def parse_location(s: str) -> tuple[str, IndirectDataReference]:
    """Parse TensorStore's ``kind:base:relative:offset:length`` (paths percent-encoded)."""
    kind, base, rel, off, length = s.split(":")
    fid = DataFileId(urllib.parse.unquote_to_bytes(base), urllib.parse.unquote_to_bytes(rel))
    return kind, IndirectDataReference(fid, int(off), int(length))


def format_location(kind: str, ref: IndirectDataReference) -> str:
    """Inverse of :func:`parse_location` (for messages and comparisons)."""
    q = lambda b: urllib.parse.quote_from_bytes(b, safe="/._-")  # noqa: E731
    return f"{kind}:{q(ref.file.base_path)}:{q(ref.file.relative_path)}:{ref.offset}:{ref.length}"


# ------------------------------------------------------------------------------ TensorStore side
def _ts_spec(root: str, version: int | str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": "ocdbt", "base": f"file://{os.path.abspath(root)}/"}
    if version is not None:
        spec["version"] = version
    return spec


def _ts_items(ts: Any, kv: Any) -> list[tuple[bytes, bytes]]:
    keys = sorted(kv.list().result())
    futs = [kv.read(k) for k in keys]
    out = []
    for k, f in zip(keys, futs):
        r = f.result()
        assert r.state == "value", (k, r.state)
        out.append((bytes(k), bytes(r.value)))
    return out


def _version_entry(v: dict[str, Any]) -> dict[str, Any]:
    root = v["root"]
    st = root["statistics"]
    return {
        "generation": v["generation_number"],
        "commit_time": v["commit_time"],
        "root": root.get("location"),
        "root_height": v["root_height"],
        "num_keys": st["num_keys"],
        "num_tree_bytes": st["num_tree_bytes"],
        "num_indirect_value_bytes": st["num_indirect_value_bytes"],
    }


def _dump_btree_node(dumped: dict[str, Any], location: str) -> dict[str, Any]:
    entries = []
    for e in dumped["entries"]:
        if "location" in e:
            st = e["statistics"]
            entries.append(
                {
                    "key": enc_key(e["key"]),
                    "subtree_common_prefix": enc_key(e["subtree_common_prefix"]),
                    "location": e["location"],
                    "statistics": [st["num_keys"], st["num_tree_bytes"], st["num_indirect_value_bytes"]],
                }
            )
        elif "inline_value" in e:
            entries.append({"key": enc_key(e["key"]), "inline": enc(e["inline_value"])})
        else:
            entries.append({"key": enc_key(e["key"]), "indirect": e["indirect_value"]})
    return {"location": location, "height": dumped["height"], "entries": entries}


def oracle_from_tensorstore(
    root: str, *, nodes: bool = True, probes: bool = True, seed: int = 0, description: str = ""
) -> dict[str, Any]:
    """Everything TensorStore reads from the database at directory ``root``, as JSON data."""
    import tensorstore as ts

    base = ts.KvStore.open(f"file://{os.path.abspath(root)}/").result()
    manifest = ts.ocdbt.dump(base).result()
    names = sorted(n for n in os.listdir(root) if n.startswith("manifest."))
    numbered = any(n != "manifest.ocdbt" for n in names)

    versions: list[dict[str, Any]] = []
    version_nodes: list[dict[str, Any]] = []

    def walk_version(loc: str) -> None:
        node = ts.ocdbt.dump(base, loc).result()
        entries = []
        for e in node["entries"]:
            if node["height"] == 0:
                versions.append(_version_entry(e))
                entries.append(e["generation_number"])
            else:
                entries.append(
                    {
                        "generation": e["generation_number"],
                        "location": e["location"],
                        "num_generations": e["num_generations"],
                        "commit_time": e["commit_time"],
                    }
                )
                walk_version(e["location"])
        version_nodes.append({"location": loc, "height": node["height"], "entries": entries})

    for ref in manifest["version_tree_nodes"]:
        walk_version(ref["location"])
    versions.extend(_version_entry(v) for v in manifest["versions"])
    versions.sort(key=lambda v: v["generation"])

    contents: list[dict[str, Any]] = []
    by_gen: dict[int, list[tuple[bytes, bytes]]] = {}
    prev: dict[bytes, str] = {}
    for v in versions:
        items = _ts_items(ts, ts.KvStore.open(_ts_spec(root, v["generation"])).result())
        by_gen[v["generation"]] = items
        cur = {k: enc(val) for k, val in items}
        contents.append(
            {
                "generation": v["generation"],
                "set": [[enc_key(k), e] for k, e in cur.items() if prev.get(k) != e],
                "deleted": [enc_key(k) for k in sorted(prev) if k not in cur],
            }
        )
        prev = cur

    out: dict[str, Any] = {
        "format": FORMAT,
        "description": description,
        "config": manifest["config"],
        "manifest_kind": "numbered" if numbered else "single",
        "manifest_files": names,
        "manifest_version_nodes": [
            {"location": r["location"], "height": r["height"], "generation": r["generation_number"]}
            for r in manifest["version_tree_nodes"]
        ],
        "versions": versions,
        "contents": contents,
    }
    if nodes:
        seen: dict[str, dict[str, Any]] = {}
        for v in versions:
            stack = [v["root"]] if v["root"] else []
            while stack:
                loc = stack.pop()
                if loc in seen:
                    continue
                d = _dump_btree_node(ts.ocdbt.dump(base, loc).result(), loc)
                seen[loc] = d
                stack.extend(e["location"] for e in d["entries"] if "location" in e)
        out["btree_nodes"] = sorted(seen.values(), key=lambda d: d["location"])
        out["version_nodes"] = sorted(version_nodes, key=lambda d: d["location"])
    if probes:
        out["probes"] = _ts_probes(ts, root, versions, by_gen, random.Random(seed))
    return out


def _ts_probes(
    ts: Any, root: str, versions: list[dict[str, Any]], by_gen: dict[int, list[tuple[bytes, bytes]]], rng: random.Random
) -> dict[str, Any]:
    """Range lists, byte-range reads and time-travel selections, each answered by TensorStore."""
    lists: list[dict[str, Any]] = []
    ranges: list[dict[str, Any]] = []
    gens = [v["generation"] for v in versions]
    sample = sorted(set(rng.sample(gens, min(4, len(gens))) + [gens[-1]]))
    for g in sample:
        kv = ts.KvStore.open(_ts_spec(root, g)).result()
        keys = [k for k, _ in by_gen[g]]
        bounds = [b"", b"\x00", b"\xff", b"k", b"z"] + [k for k in keys[:: max(1, len(keys) // 4)]]
        bounds += [k[: len(k) // 2] for k in keys[1 :: max(1, len(keys) // 3)]]
        for _ in range(4):
            lo, hi = sorted(rng.sample(bounds, 2)) if len(bounds) > 1 else (b"", b"")
            got = sorted(kv.list(ts.KvStore.KeyRange(lo, hi)).result())
            # TensorStore reads an empty exclusive_max as "no upper bound"
            stop = enc_key(hi) if hi else None
            lists.append({"generation": g, "start": enc_key(lo), "stop": stop, "keys": [enc_key(k) for k in got]})
        got = sorted(kv.list(ts.KvStore.KeyRange(inclusive_min=bounds[-1])).result())
        lists.append({"generation": g, "start": enc_key(bounds[-1]), "stop": None, "keys": [enc_key(k) for k in got]})
        for k, val in rng.sample(by_gen[g], min(4, len(by_gen[g]))):
            n = len(val)
            for a, b in {(0, n), (0, min(1, n)), (n // 3, n - n // 4), (n, n)}:
                if a > b:
                    continue
                r = kv.read(k, byte_range=slice(a, b)).result()
                ranges.append({"generation": g, "key": enc_key(k), "start": a, "stop": b, "value": enc(bytes(r.value))})
            if n:
                s = rng.randint(1, n)
                r = kv.read(k, byte_range=slice(-s, None)).result()
                value = enc(bytes(r.value))
                ranges.append({"generation": g, "key": enc_key(k), "start": -s, "stop": None, "value": value})
    times: list[dict[str, Any]] = []
    for v in versions:
        t = v["commit_time"]
        for tt in (t - 1, t, t + 1):
            iso = format_nanoseconds(tt)
            try:
                kv = ts.KvStore.open(_ts_spec(root, iso)).result()
                items = _ts_items(ts, kv)
                times.append({"version": iso, "digest": digest_items(items)})
            except ValueError as e:  # NOT_FOUND surfaces as ValueError
                assert "NOT_FOUND" in str(e), e
                times.append({"version": iso, "digest": None})
    return {"lists": lists, "byte_ranges": ranges, "times": times}


# ------------------------------------------------------------------------------ our side
def _loc(ref: IndirectDataReference | None, kind: str = "btreenode") -> str | None:
    return None if ref is None else format_location(kind, ref)


def _same_location(ts_loc: str | None, ref: IndirectDataReference | None) -> bool:
    if ts_loc is None or ref is None:
        return ts_loc is None and ref is None
    return parse_location(ts_loc)[1] == ref


def check_store(root: str | os.PathLike[str] | Any, oracle: dict[str, Any], *, deep: bool = True) -> None:
    """Assert that ocdbt-py reads the database at ``root`` exactly as ``oracle`` records.

    ``root`` is a directory or a :class:`~ocdbt_py.kvstore.KvStore`.
    """
    db = ocdbt_py.open(root)
    cfg = db.config
    ocfg = oracle["config"]
    assert cfg.uuid.hex() == ocfg["uuid"]
    assert cfg.max_inline_value_bytes == ocfg["max_inline_value_bytes"]
    assert cfg.max_decoded_node_bytes == ocfg["max_decoded_node_bytes"]
    assert cfg.version_tree_arity_log2 == ocfg["version_tree_arity_log2"]
    comp = ocfg.get("compression")
    assert (cfg.compression_level is None) == (comp is None)
    if comp is not None:
        assert cfg.compression_level == comp.get("level", 0)
    assert (cfg.manifest_kind == MANIFEST_KIND_NUMBERED) == (oracle["manifest_kind"] == "numbered")

    # -- versions
    ours = db.versions()
    expected = oracle["versions"]
    assert [v.generation for v in ours] == [v["generation"] for v in expected]
    for o, e in zip(ours, expected):
        assert o.commit_time_ns == e["commit_time"], o.generation
        assert _same_location(e["root"], o.root), (o.generation, e["root"], o.root)
        assert o.root_height == e["root_height"]
        assert (o.num_keys, o.num_tree_bytes, o.num_indirect_value_bytes) == (
            e["num_keys"],
            e["num_tree_bytes"],
            e["num_indirect_value_bytes"],
        )
    assert db.generation == expected[-1]["generation"]

    # -- contents of every generation
    contents = expand_contents(oracle)
    for v in expected:
        g = v["generation"]
        want = contents[g]
        s = db.at(g)
        assert s.generation == g
        items = list(s.items(batch=7))
        assert [(k, enc(val)) for k, val in items] == want, f"generation {g}"
        assert len(s) == len(want) == v["num_keys"]
        keys = [k for k, _ in items]
        assert list(s.list()) == keys
        assert [(e.key, e.size) for e in s.entries()] == [(k, len(val)) for k, val in items]
        if deep or g == expected[-1]["generation"]:
            assert s.get_many(keys) == [val for _, val in items]
            for k, val in items[:: max(1, len(items) // 8)]:
                assert s.get(k) == val
                assert k in s
            # absent neighbours of present keys
            for k in keys[:: max(1, len(keys) // 8)]:
                for probe in (k + b"\x00", k[:-1]):
                    if probe not in keys and len(probe) <= 65535:
                        assert s.get(probe) is None
                        assert probe not in s
        # list bounds against the sorted contents
        if keys and deep:
            for lo, hi in ((keys[0], keys[-1]), (keys[len(keys) // 2], None), (b"", keys[len(keys) // 3])):
                end = len(keys) if hi is None else bisect.bisect_left(keys, hi)
                want_keys = keys[bisect.bisect_left(keys, lo) : end]
                assert list(s.list(start=lo, stop=hi)) == want_keys
            for k in keys[:: max(1, len(keys) // 5)]:
                for plen in {0, 1, len(k) // 2, len(k)}:
                    p = k[:plen]
                    assert list(s.list(prefix=p)) == [x for x in keys if x.startswith(p)]

    # -- TensorStore's answers to list / byte-range / time-travel probes
    probes = oracle.get("probes")
    if probes:
        for p in probes["lists"]:
            s = db.at(p["generation"])
            stop = None if p["stop"] is None else dec_key(p["stop"])
            got = [enc_key(k) for k in s.list(start=dec_key(p["start"]), stop=stop)]
            assert got == p["keys"], p
        for p in probes["byte_ranges"]:
            s = db.at(p["generation"])
            value = s.get(dec_key(p["key"]), (p["start"], p["stop"]))
            assert value is not None and enc(value) == p["value"], p
        for p in probes["times"]:
            if p["digest"] is None:
                try:
                    db.at(p["version"])
                except NotFoundError:
                    continue
                raise AssertionError(f"version {p['version']} should not exist")
            assert digest_items(list(db.at(p["version"]).items())) == p["digest"], p
        opened = [p for p in probes["times"] if p["digest"] is not None][-1:]
        for p in opened:  # the same selection through open(version=...)
            other = ocdbt_py.open(root, version=p["version"])
            assert digest_items(list(other.items())) == p["digest"], p

    # -- datetime selection (microsecond precision; compared with the versions list)
    times = [v["commit_time"] for v in expected]
    for v in expected[:: max(1, len(expected) // 6)]:
        t = v["commit_time"]
        when = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc) + _dt.timedelta(microseconds=t // 1000)
        i = bisect.bisect_right(times, (t // 1000) * 1000) - 1
        if i < 0:
            try:
                db.at(when)
            except NotFoundError:
                continue
            raise AssertionError("datetime before the first commit should not resolve")
        assert db.at(when).generation == expected[i]["generation"]
        naive = when.replace(tzinfo=None)
        assert db.at(naive).generation == expected[i]["generation"]

    # -- every node, decoded, against TensorStore's dump
    reader = NodeReader(db.kvstore, cfg)
    for n in oracle.get("btree_nodes", []):
        _, ref = parse_location(n["location"])
        node = reader.btree_node(ref, n["height"])
        assert node.height == n["height"]
        assert len(node.keys) == len(n["entries"]), n["location"]
        for i, e in enumerate(n["entries"]):
            assert node.keys[i] == dec_key(e["key"]), (n["location"], i)
            if isinstance(node, InteriorNode):
                scp = node.subtree_prefix_lengths[i]
                assert node.keys[i][:scp] == dec_key(e["subtree_common_prefix"])
                assert _same_location(e["location"], node.children[i].location)
                assert list(node.children[i].statistics) == e["statistics"]
            else:
                assert isinstance(node, LeafNode)
                stored = node.values[i]
                if "inline" in e:
                    assert isinstance(stored, bytes) and enc(stored) == e["inline"]
                else:
                    assert isinstance(stored, IndirectDataReference) and _same_location(e["indirect"], stored)
    for n in oracle.get("version_nodes", []):
        _, ref = parse_location(n["location"])
        last = n["entries"][-1] if n["height"] == 0 else n["entries"][-1]["generation"]
        vnode = reader.version_node(ref, n["height"], last)
        if n["height"] == 0:
            assert [v.generation_number for v in vnode.versions] == n["entries"]
        else:
            assert [
                {
                    "generation": c.generation_number,
                    "location": c.location,
                    "num_generations": c.num_generations,
                    "commit_time": c.commit_time,
                }
                for c in vnode.children
            ] == [{**e, "location": parse_location(e["location"])[1]} for e in n["entries"]]
    assert [
        (r.height, r.generation_number, r.location) for r in db.manifest.version_nodes
    ] == [(r["height"], r["generation"], parse_location(r["location"])[1]) for r in oracle["manifest_version_nodes"]]
    db.close()
