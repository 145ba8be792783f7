"""Fixtures for the command-line tool tests: tiny databases built with our own encoders,
TensorStore-written databases, and an in-process runner for ``ocdbt_py.cli.main``."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ocdbt_py.cli import main
from ocdbt_py.format.btree import BtreeChild, encode_interior_node, encode_leaf_node
from ocdbt_py.format.config import Config
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference, Statistics
from ocdbt_py.format.manifest import Manifest, encode_manifest
from ocdbt_py.format.version_tree import BtreeGenerationReference

#: Keys of the tiny database: plain, nested, non-UTF-8, control bytes, a backslash, unicode.
TINY_ITEMS: dict[bytes, bytes] = {
    b"a": b"1",
    b"b/x": b"short",
    b"b/y": b"a value longer than the inline limit",
    b"back\\slash": b"bs",
    b"bin\xff\xfe": b"\x00\x01\x02\xff" * 8,
    b"ctl\n\t": b"ctl",
    "caf\u00e9".encode(): b"unicode key",
    b"z" * 40: b"long key",
}
BASE_TIME = 1_700_000_000_000_000_000


@dataclasses.dataclass
class BuiltDb:
    """Where a tiny database lives and where its nodes are."""

    root: Path
    items: dict[bytes, bytes]
    generations: int
    data_files: list[str]  # one per generation: "d/genNNNN"
    leaves: list[IndirectDataReference]  # leaves of the last generation
    root_ref: IndirectDataReference  # root node of the last generation

    def path(self, key: str) -> Path:
        """Filesystem path of a key of the store (``d/gen0001``)."""
        return self.root / key


def build_db(
    root: Path,
    items: dict[bytes, bytes] | None = None,
    *,
    generations: int = 2,
    leaf_size: int = 3,
    inline_limit: int = 16,
    zstd: int | None = None,
    bad_leaf_stats: bool = False,
    bad_root_stats: bool = False,
    bad_entry_key: bool = False,
) -> BuiltDb:
    """Write an OCDBT database (B+tree of height 1) with our encoders.

    Generation ``g`` holds the first ``g/generations`` of the sorted keys, in its own data
    file ``d/genNNNN`` (values first, then the leaves, then the root).  The ``bad_*`` flags
    plant wrong statistics / a wrong interior key in the last generation.
    """
    items = dict(TINY_ITEMS if items is None else items)
    keys = sorted(items)
    (root / "d").mkdir(parents=True, exist_ok=True)
    versions = []
    files = []
    leaves: list[IndirectDataReference] = []
    rref: IndirectDataReference | None = None
    for g in range(1, generations + 1):
        last = g == generations
        sub = keys[: max(1, len(keys) * g // generations)]
        fkey = f"d/gen{g:04d}"
        files.append(fkey)
        fid = DataFileId(b"", fkey.encode())
        buf = bytearray()

        def put(b: bytes, fid: DataFileId = fid, buf: bytearray = buf) -> IndirectDataReference:
            off = len(buf)
            buf += b
            return IndirectDataReference(fid, off, len(b))

        entries = []
        leaves = []
        for i in range(0, len(sub), leaf_size):
            ks = sub[i : i + leaf_size]
            vals: list[bytes | IndirectDataReference] = []
            ind = 0
            for k in ks:
                v = items[k]
                if len(v) > inline_limit:
                    vals.append(put(v))
                    ind += len(v)
                else:
                    vals.append(v)
            enc = encode_leaf_node(list(ks), vals, zstd)
            ref = put(enc)
            leaves.append(ref)
            entries.append((ks[0], BtreeChild(ref, Statistics(len(ks), len(enc), ind))))
        true_children = [c for _, c in entries]
        children = list(true_children)
        if last and bad_leaf_stats:
            c = children[0]
            children[0] = BtreeChild(c.location, c.statistics._replace(num_keys=c.statistics.num_keys + 1))
        ikeys = [k for k, _ in entries]
        if last and bad_entry_key and len(ikeys) > 1:
            ikeys[1] = ikeys[1] + b"\x00"  # above the child's first key
        enc = encode_interior_node(1, ikeys, [0] * len(entries), children, zstd)
        rref = put(enc)
        total = Statistics(
            sum(c.statistics.num_keys for c in children),
            len(enc) + sum(c.statistics.num_tree_bytes for c in children),
            sum(c.statistics.num_indirect_value_bytes for c in children),
        )
        if last and bad_root_stats:
            total = total._replace(num_indirect_value_bytes=total.num_indirect_value_bytes + 7)
        versions.append(BtreeGenerationReference(g, rref, 1, total, BASE_TIME + g * 1_000_000_000))
        (root / fkey).write_bytes(bytes(buf))
    config = Config(uuid=bytes(range(16)), max_inline_value_bytes=inline_limit, compression_level=zstd)
    (root / "manifest.ocdbt").write_bytes(encode_manifest(Manifest(config, tuple(versions), ())))
    assert rref is not None
    return BuiltDb(root, items, generations, files, leaves, rref)


@pytest.fixture
def tiny_db(tmp_path: Path) -> BuiltDb:
    """A clean two-generation database written with our own encoders."""
    return build_db(tmp_path / "db")


@dataclasses.dataclass
class Result:
    """Exit status and captured output of one in-process run."""

    status: int
    out: str
    err: str
    out_bytes: bytes


@pytest.fixture
def cli(capsysbinary: pytest.CaptureFixture[bytes]) -> Callable[..., Result]:
    """Run ``ocdbt ARGS...`` in-process; returns status, stdout (text and bytes) and stderr."""

    def run(*args: str | os.PathLike[str]) -> Result:
        capsysbinary.readouterr()
        status = main([os.fspath(a) for a in args])
        cap = capsysbinary.readouterr()
        return Result(status, cap.out.decode("utf-8", "replace"), cap.err.decode("utf-8", "replace"), cap.out)

    return run


def ocdbt_command() -> list[str]:
    """The installed ``ocdbt`` script next to this interpreter, else ``python -m ocdbt_py.cli``."""
    script = Path(sys.executable).parent / "ocdbt"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "ocdbt_py.cli"]


def run_subprocess(*args: str | os.PathLike[str], timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    """Run the real command in a child process."""
    return subprocess.run(
        [*ocdbt_command(), *(os.fspath(a) for a in args)], capture_output=True, timeout=timeout, check=False
    )


def flip_byte(path: Path, offset: int) -> None:
    """XOR one byte of a file with 0xFF."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def make_db() -> Callable[..., BuiltDb]:
    """The :func:`build_db` factory (test modules must not import conftest directly)."""
    return build_db


@pytest.fixture
def subproc() -> Callable[..., subprocess.CompletedProcess[bytes]]:
    """:func:`run_subprocess`: run the real ``ocdbt`` command."""
    return run_subprocess


@pytest.fixture
def flip() -> Callable[[Path, int], None]:
    """:func:`flip_byte`."""
    return flip_byte


@pytest.fixture
def tiny_items() -> dict[bytes, bytes]:
    """The keys and values of :func:`tiny_db`."""
    return dict(TINY_ITEMS)
