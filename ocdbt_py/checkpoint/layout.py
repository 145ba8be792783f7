"""Recognising what a directory is: an item, a step holding items, or a manager root.

See ``spec/orbax.md`` sections 1 and 2 for the rules implemented here.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import os
import re
import warnings
from typing import Any

from ocdbt_py.checkpoint.jsonio import MAX_JSON_BYTES, read_json
from ocdbt_py.errors import NotFoundError
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.pools import shared
from ocdbt_py.read.version_read import manifest_read_limit

__all__ = [
    "Kind",
    "Listing",
    "StepEntry",
    "classify",
    "list_steps",
    "list_items",
    "select_step",
    "UncommittedStepWarning",
    "TMP_SUFFIX",
    "COMMIT_MARKER",
    "RESERVED_ITEMS",
    "json_item_file",
    "dir_name",
    "store_dir_name",
    "parse_step_name",
    "param_dir_problem",
    "step_metadata",
    "is_v1_checkpoint",
]

TMP_SUFFIX = ".orbax-checkpoint-tmp"
COMMIT_MARKER = "commit_success.txt"
STEP_METADATA = "_CHECKPOINT_METADATA"
V1_INDICATOR = "orbax.checkpoint"
#: Item names Orbax reserves that never hold user data worth restoring by default.
RESERVED_ITEMS = frozenset({"descriptor"})
#: Names an array cannot have in the per-parameter layout, where each array is a directory
#: named after it next to these files and directories of the item (or of its step).
RESERVED_PARAM_NAMES = frozenset({"_METADATA", "_sharding", "_strings.json", "manifest.ocdbt", "checkpoint",
                                  COMMIT_MARKER, STEP_METADATA, "array_metadatas", "descriptor", ".ocdbt-cp",
                                  V1_INDICATOR})


def param_dir_problem(name: str) -> str | None:
    """Why the array ``name`` (dot-joined param name) cannot be a directory of the
    per-parameter layout (``None``: it can): a path separator, a control character (NUL...),
    ``.``/``..``, or a name the layout itself uses (:data:`RESERVED_PARAM_NAMES`, temporary
    directories, OCDBT process directories)."""
    if not name or name in (".", ".."):
        return "is not a directory name"
    if "/" in name or "\\" in name:
        return "contains a path separator"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "contains a control character (NUL, newline, ...)"
    if name in RESERVED_PARAM_NAMES or name.startswith("ocdbt.process_") or TMP_SUFFIX in name:
        return "is a name the checkpoint layout itself uses"
    return None
_STEP_NAME = re.compile(r"^(?:(?P<prefix>.*?)_)?(?P<step>[0-9]+)$")


class UncommittedStepWarning(UserWarning):
    """A step directory has no commit marker and was skipped."""


class Kind(enum.Enum):
    """What a checkpoint directory holds."""

    PYTREE = "pytree"  #: one PyTree item (arrays, scalars, strings)
    JSON = "json"  #: one JSON item (a ``metadata`` file)
    JSON_DIR = "json_dir"  #: a directory of ``*.json`` files (e.g. ``process_metadata``)
    STEP = "step"  #: a step directory holding named items
    ROOT = "root"  #: a CheckpointManager root holding step directories


@dataclasses.dataclass
class Listing:
    """The direct children of a directory; on object stores (listed recursively anyway) also
    the size of every file below it, by path relative to the directory."""

    dirs: list[str]
    files: list[str]
    sizes: dict[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, kv: KvStore, prefix: str = "", *, read_ahead: bool = False) -> Listing:
        """The listing of the directory at ``prefix`` of ``kv``.

        ``read_ahead``: first start fetching the small files a restore of the directory reads
        first (``_CHECKPOINT_METADATA``, ``_METADATA``, ``manifest.ocdbt``, ``_strings.json``)
        where the store can (:attr:`~ocdbt_py.kvstore.KvStore.supports_read_ahead`: object
        stores): they then arrive in one round trip, concurrently with the listing, instead of
        one round trip each after it; each answers the next read of that file, with the same
        size limit.
        """
        if read_ahead and kv.supports_read_ahead:
            kv.read_ahead([(prefix + name, (0, limit)) for name, limit in _first_reads()])
        if not kv.lists_sizes:
            d, f = kv.list_dir(prefix)
            return cls(sorted(d), sorted(f))
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        dirs: set[str] = set()
        files: list[str] = []
        sizes: dict[str, int] = {}
        for key, size in kv.list_sized(prefix):
            rest = key[len(prefix):]
            if "/" in rest:
                dirs.add(rest.split("/", 1)[0])
            else:
                files.append(rest)
            if size is not None:
                sizes[rest] = size
        return cls(sorted(dirs), sorted(files), sizes)


_PYTREE_FILES = ("_METADATA", "manifest.ocdbt", "checkpoint", "_sharding", "_strings.json")
#: Largest ``_CHECKPOINT_METADATA`` read.
STEP_METADATA_LIMIT = 16 << 20


def _first_reads() -> tuple[tuple[str, int], ...]:
    """The small files restoring a directory reads first, one after another, each with the
    end of the byte range it is read with (its size limit plus one)."""

    return ((STEP_METADATA, STEP_METADATA_LIMIT + 1), ("_METADATA", MAX_JSON_BYTES + 1),
            ("manifest.ocdbt", manifest_read_limit()), ("_strings.json", MAX_JSON_BYTES + 1))


def _is_pytree(lst: Listing) -> bool | None:
    """Whether the listing is a PyTree item's; ``None`` when that depends on what its
    ``checkpoint`` directory holds (ArrayCheckpointHandler's single per-param directory is a
    Zarr array), which the listing does not say."""
    if any(f in lst.files for f in _PYTREE_FILES):
        return True
    if any(d.startswith("ocdbt.process_") for d in lst.dirs):
        return True
    return None if "checkpoint" in lst.dirs else False


def _data_files(lst: Listing) -> list[str]:
    return [f for f in lst.files if f not in (COMMIT_MARKER, STEP_METADATA)]


def _is_json_dir(lst: Listing) -> bool:
    files = _data_files(lst)
    return bool(files) and not lst.dirs and all(f.endswith(".json") for f in files)


#: The file Orbax v1's ``JsonHandler`` writes (``<item>/data.json``).
V1_JSON_FILE = "data.json"


#: The files of Orbax's ``process_metadata`` item (the multi-tier manager's topology, see
#: :mod:`ocdbt_py.checkpoint.manager.mesh_metadata`): a directory of JSON documents by name
GLOBAL_PROCESS_METADATA = "global_process_metadata.json"
MESH_METADATA = "mesh_metadata.json"
#: ... restored as ``{file name: document}`` even when only one of them is there
JSON_DIR_MEMBERS = frozenset({GLOBAL_PROCESS_METADATA, MESH_METADATA})


def json_item_file(lst: Listing, name: str | None = None) -> str | None:
    """The file holding a JSON item's document: ``metadata`` (JsonCheckpointHandler's default),
    a file named like the item directory ``name`` itself (``metrics/metrics``), or the
    directory's only data file when it is a ``*.json`` file: Orbax v1's ``data.json``, or the
    ``filename`` a v0 ``JsonCheckpointHandler`` or v1 ``JsonHandler`` was given.  A directory
    of several ``*.json`` files (or of a :data:`JSON_DIR_MEMBERS` file), such as
    ``process_metadata``, is a JSON directory item instead."""
    if "metadata" in lst.files:
        return "metadata"
    if name and name in lst.files and not lst.dirs:
        return name
    if not lst.dirs:
        files = _data_files(lst)
        if len(files) == 1 and files[0].endswith(".json") and files[0] not in JSON_DIR_MEMBERS:
            return files[0]
    return None


def dir_name(prefix: str) -> str | None:
    """The last path segment of a ``/``-terminated prefix (``None`` for the root)."""
    p = prefix.rstrip("/")
    return p.rsplit("/", 1)[-1] if p else None


def store_dir_name(kv: KvStore) -> str | None:
    """The directory name a store is rooted at, when known (prefix stores and local paths)."""
    url = kv.url.rstrip("/")
    return url.rsplit("/", 1)[-1] if "/" in url else None


def parse_step_name(name: str) -> int | None:
    """The step number of a step directory name in any of Orbax's formats (``"12"``,
    ``"000012"``, ``"ckpt_12"``, ``"ckpt_000012"``), else ``None``.

    The whole name must match (``"12\\n"`` is no step) and the digits are ASCII.  Not knowing
    the root's format, this accepts every format; :func:`list_steps` settles a step number
    that several names give by the format most of the root's steps use."""
    if TMP_SUFFIX in name or not name.isascii():
        return None
    m = _STEP_NAME.fullmatch(name)
    return int(m.group("step")) if m else None


def _step_format(name: str) -> tuple[str, bool]:
    """``(prefix, zero-padded)`` of a step name :func:`parse_step_name` accepts."""
    m = _STEP_NAME.fullmatch(name)
    assert m is not None
    digits = m.group("step")
    return m.group("prefix") or "", len(digits) > 1 and digits[0] == "0"


def classify(kv: KvStore, prefix: str = "", listing: Listing | None = None) -> Kind:
    """Decide what the directory at ``prefix`` of ``kv`` holds.

    Raises :class:`NotFoundError` when it is none of the known layouts.
    """
    lst = listing or Listing.of(kv, prefix)
    pytree = _is_pytree(lst)
    if pytree is None:
        pytree = kv.exists(prefix + "checkpoint/.zarray") or kv.exists(prefix + "checkpoint/zarr.json")
    if pytree:
        return Kind.PYTREE
    if json_item_file(lst, dir_name(prefix) if prefix else store_dir_name(kv)) is not None:
        return Kind.JSON
    if STEP_METADATA in lst.files or V1_INDICATOR in lst.files:
        return Kind.STEP
    if any(parse_step_name(d) is not None for d in lst.dirs):
        # A step dir is itself made of item dirs; a root is made of step dirs.  A step's items
        # never have numeric names in practice, so numeric children mean a root.
        return Kind.ROOT
    if _is_json_dir(lst):
        return Kind.JSON_DIR
    items = [d for d in lst.dirs if TMP_SUFFIX not in d]
    for d in items:
        try:
            kind = classify(kv, f"{prefix}{d}/")
        except NotFoundError:
            continue
        if kind in (Kind.PYTREE, Kind.JSON):
            return Kind.STEP
    where = kv.url.rstrip("/") + ("/" + prefix.rstrip("/") if prefix else "")
    if not lst.dirs and not lst.files:
        local = kv.local_path(prefix.rstrip("/")) if prefix else kv.local_path()
        if local is not None and os.path.isfile(local.rstrip("/")):
            raise NotFoundError(f"{where} is a file, not a database or checkpoint (give a checkpoint item, "
                                "step or root directory)")
        raise NotFoundError(f"{where} does not exist or is empty (no Orbax checkpoint there)")
    raise NotFoundError(f"{where} is not an Orbax checkpoint (no item, step or step directories found)")


@dataclasses.dataclass(frozen=True)
class StepEntry:
    """One finalized step directory of a manager root."""

    step: int
    name: str
    committed: bool


def _renames_atomically(kv: KvStore) -> bool:
    """``False`` for object stores (fsspec filesystems other than local ones), where Orbax and
    ``ocdbt_py.checkpoint.save`` write in place and ``commit_success.txt`` is the only commit
    point, so a step without it is unfinished even if no step has one."""
    return kv.renames_atomically


def list_steps(kv: KvStore, *, warn: bool = True, listing: Listing | None = None) -> list[StepEntry]:
    """The finalized steps under a manager root, sorted by step number.

    Temporary directories (``*.orbax-checkpoint-tmp*``) are ignored.  A step without
    ``commit_success.txt`` is an unfinished save, and is skipped with an
    :class:`UncommittedStepWarning`, unless no step under the root has the marker at all (the
    checkpoints then predate commit markers and were finalized by an atomic rename).
    ``listing`` is the root's listing if already known.  The markers are looked up
    concurrently.
    """
    lst = listing or Listing.of(kv)
    candidates: list[tuple[int, str]] = []
    for d in lst.dirs:
        s = parse_step_name(d)
        if s is not None:
            candidates.append((s, d))
    # A step number several names give (``12``, ``0012``, ``x_12``) is the one named in the
    # format most of the root's steps use (ties: the plain integer), never whichever sorts first.
    formats = collections.Counter(_step_format(d) for _, d in candidates)
    candidates.sort(key=lambda sd: (sd[0], -formats[_step_format(sd[1])], _step_format(sd[1]) != ("", False), sd[1]))
    marks = _markers(kv, [d for _, d in candidates]) if len(candidates) < 4096 else None
    if marks is None:  # very many steps: one listing instead of one request per step
        have = {k.split("/", 1)[0] for k in kv.list() if k.endswith("/" + COMMIT_MARKER) and k.count("/") == 1}
        marks = [d in have for _, d in candidates]
    # Markerless steps are legacy rename-style saves only where directories rename atomically
    # (local disks); on object stores an unmarked step is an unfinished in-place save.
    any_marked = any(marks) or not _renames_atomically(kv)
    out: list[StepEntry] = []
    seen: dict[int, str] = {}
    for (s, d), marked in zip(candidates, marks):
        if any_marked and not marked:
            if warn:
                warnings.warn(
                    f"skipping step {s} ({d}): it has no {COMMIT_MARKER}, so its save did not finish",
                    UncommittedStepWarning,
                    stacklevel=3,
                )
            continue
        if s in seen:
            warnings.warn(f"step {s} appears twice ({seen[s]!r} and {d!r}); using {seen[s]!r}", stacklevel=3)
            continue
        seen[s] = d
        out.append(StepEntry(s, d, marked))
    return out


def select_step(kv: KvStore, step: int | None, *, listing: Listing | None = None) -> StepEntry:
    """The entry for ``step`` (the latest finalized step when ``None``); ``listing`` is the
    root's listing if already known."""
    steps = list_steps(kv, listing=listing)
    if not steps:
        raise NotFoundError(f"{kv.url}: no finalized step directories")
    if step is None:
        return steps[-1]
    for e in steps:
        if e.step == step:
            return e
    raise NotFoundError(f"{kv.url}: no finalized step {step} (have {[e.step for e in steps]})")


def step_metadata(kv: KvStore, prefix: str = "") -> dict[str, Any] | None:
    """The parsed ``_CHECKPOINT_METADATA`` of a step (or item) directory, if any."""
    doc = read_json(kv, prefix + STEP_METADATA, STEP_METADATA_LIMIT)
    return doc if isinstance(doc, dict) else None


def list_items(kv: KvStore, prefix: str = "", *, listing: Listing | None = None,
               listings: dict[str, Listing] | None = None,
               metadata: dict[str, Any] | None = None) -> dict[str, Kind]:
    """The items of a step directory: ``{name: kind}`` in name order.

    Temporary item dirs and unrecognised directories are left out; so is the reserved
    ``descriptor`` item.  ``listing`` is the step directory's own listing if already known;
    the item directories are listed concurrently (with their first reads started, see
    :meth:`Listing.of`), and ``listings``, if given, receives each item's listing by name.  ``metadata``
    is the step's parsed ``_CHECKPOINT_METADATA`` if already read.
    """
    lst = listing or Listing.of(kv, prefix)
    meta = metadata if metadata is not None else step_metadata(kv, prefix) or {}
    handlers = meta.get("item_handlers")
    names = [d for d in lst.dirs if TMP_SUFFIX not in d and d not in RESERVED_ITEMS]
    found = _listings(kv, [f"{prefix}{name}/" for name in names])
    out: dict[str, Kind] = {}
    for name, sub in zip(names, found):
        try:
            kind = classify(kv, f"{prefix}{name}/", listing=sub)
        except NotFoundError:
            if isinstance(handlers, dict) and name in handlers:
                warnings.warn(f"item {name!r} ({handlers[name]}) has no data this reader understands", stacklevel=2)
            continue
        if kind in (Kind.PYTREE, Kind.JSON, Kind.JSON_DIR):
            out[name] = kind
            if listings is not None:
                listings[name] = sub
    return out


def _markers(kv: KvStore, names: list[str]) -> list[bool]:
    """Whether each step directory has its commit marker (looked up concurrently)."""
    keys = [f"{d}/{COMMIT_MARKER}" for d in names]
    if len(keys) <= 1:
        return [kv.exists(k) for k in keys]

    futs = [shared("io").submit(kv.exists, k) for k in keys]
    return [f.result() for f in futs]


def _listings(kv: KvStore, prefixes: list[str]) -> list[Listing]:
    """:meth:`Listing.of` each directory with its first reads started, concurrently (one
    round trip for all on stores reached over a network)."""
    if len(prefixes) <= 1:
        return [Listing.of(kv, p, read_ahead=True) for p in prefixes]

    futs = [shared("io").submit(Listing.of, kv, p, read_ahead=True) for p in prefixes]
    return [f.result() for f in futs]


def is_v1_checkpoint(kv: KvStore, prefix: str = "") -> bool:
    """Whether the directory carries the v1 API's ``orbax.checkpoint`` indicator file."""
    return kv.exists(prefix + V1_INDICATOR)
