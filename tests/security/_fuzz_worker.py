"""Child process of ``test_fuzz.py``: damage one object of a TensorStore-written database per
case and read the whole database, under an address-space limit and a per-case alarm.

Usage: ``python _fuzz_worker.py ours|tensorstore CASES.json OUT.json``.  ``ours`` runs every
case through ocdbt-py (with ``RLIMIT_AS`` set before anything is imported) and records, per
case, ``error`` (our error type's name), ``foreign`` (any other exception), ``hang`` (the
alarm fired) or the digest of what was read; ``tensorstore`` reads the listed cases with
TensorStore (no limit: it reserves large virtual arenas) and records the same digests.
"""

from __future__ import annotations

import hashlib
import json
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FIXTURES = ROOT / "conformance" / "fixtures" / "ocdbt"
AS_LIMIT = 2 << 30
CASE_SECONDS = 3


class Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang


def load_fixture(name: str) -> dict[str, bytes]:
    root = FIXTURES / name
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def damaged(files: dict[str, bytes], case: dict[str, Any]) -> dict[str, bytes]:
    """The database with ``case`` applied: a flip (xor) or truncation of one object."""
    from ocdbt_py.format.envelope import crc32c

    key, off, length = case["file"], case["offset"], case["length"]
    blob = bytearray(files[key][off: off + length])
    if case["op"] == "flip":
        blob[case["pos"]] ^= case["xor"]
        if case["fix_crc"]:
            blob[-4:] = crc32c(bytes(blob[:-4])).to_bytes(4, "little")
    else:  # truncate the object to ``pos`` bytes (the rest of its file stays)
        blob = blob[: case["pos"]]
    out = dict(files)
    out[key] = files[key][:off] + bytes(blob) + files[key][off + length:]
    return out


def digest(snapshot: dict[int, list[tuple[bytes, bytes]]]) -> str:
    h = hashlib.sha256()
    for gen in sorted(snapshot):
        h.update(b"G%d;" % gen)
        for k, v in sorted(snapshot[gen]):
            h.update(len(k).to_bytes(4, "little") + k + len(v).to_bytes(8, "little") + v)
    return h.hexdigest()


def read_ours(files: dict[str, bytes]) -> dict[int, list[tuple[bytes, bytes]]]:
    import ocdbt_py
    from ocdbt_py.kvstore import MemoryStore

    db = ocdbt_py.open(MemoryStore(files))
    return {v.generation: list(db.at(v.generation).items()) for v in db.versions()}


def read_tensorstore(files: dict[str, bytes], gens: list[int]) -> dict[int, list[tuple[bytes, bytes]]]:
    import tensorstore as ts

    ctx = ts.Context()
    base = ts.KvStore.open({"driver": "memory"}, context=ctx).result()
    for k, v in files.items():
        base.write(k, v).result()
    out = {}
    for g in gens:
        kv = ts.KvStore.open({"driver": "ocdbt", "base": {"driver": "memory"}, "version": g}, context=ctx).result()
        out[g] = [(bytes(k), bytes(kv.read(k).result().value)) for k in kv.list().result()]
    return out


def run_ours(cases: list[dict[str, Any]]) -> dict[str, Any]:
    from ocdbt_py.errors import OcdbtError

    signal.signal(signal.SIGALRM, _alarm)
    fixtures: dict[str, dict[str, bytes]] = {}
    results = []
    slowest = 0.0
    for case in cases:
        files = fixtures.get(case["fixture"])
        if files is None:
            files = fixtures[case["fixture"]] = load_fixture(case["fixture"])
        db = damaged(files, case)
        t0 = time.perf_counter()
        signal.alarm(CASE_SECONDS)
        try:
            snap = read_ours(db)
            res: dict[str, Any] = {"ok": digest(snap), "gens": sorted(snap)}
        except Hang:
            res = {"hang": True}
        except OcdbtError as e:
            res = {"error": type(e).__name__}
        except BaseException as e:  # noqa: BLE001 - exactly what the fuzz run looks for
            res = {"foreign": f"{type(e).__name__}: {e}"[:300]}
        finally:
            signal.alarm(0)
        slowest = max(slowest, time.perf_counter() - t0)
        results.append(res)
    from tests import peak_rss  # on sys.path since main(); the test tree's helper

    return {"results": results, "peak_rss_kib": peak_rss.peak_kib(), "slowest_case_s": slowest}


def run_tensorstore(cases: list[dict[str, Any]]) -> dict[str, Any]:
    results = []
    fixtures: dict[str, dict[str, bytes]] = {}
    for case in cases:
        files = fixtures.get(case["fixture"])
        if files is None:
            files = fixtures[case["fixture"]] = load_fixture(case["fixture"])
        try:
            results.append({"ok": digest(read_tensorstore(damaged(files, case), case["gens"]))})
        except Exception as e:  # noqa: BLE001 - TensorStore's errors are ValueError etc.
            results.append({"error": f"{type(e).__name__}: {e}"[:200]})
    return {"results": results}


def main() -> None:
    mode, cases_path, out_path = sys.argv[1:4]
    sys.path.insert(0, str(ROOT))
    from tests import peak_rss  # the test tree's helper: this script runs outside the package

    peak_rss.start()  # ru_maxrss would carry the forked test runner's peak over exec
    if mode == "ours":
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    cases = json.loads(Path(cases_path).read_text())
    out = run_ours(cases) if mode == "ours" else run_tensorstore(cases)
    Path(out_path).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
