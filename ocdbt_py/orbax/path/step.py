"""``ocp.step`` / ``ocp.path.step``: how step directories are named and found.

Orbax's ``NameFormat`` protocol (``build_name``, ``find_all``, ``find_step``), its
``standard_name_format`` (``[<prefix>_]<step>``, optionally zero-padded; what
``CheckpointManagerOptions(step_name_format=...)`` takes) and the step-path helpers
(``get_save_directory``, ``checkpoint_steps``, ``is_path_finalized``, ...).  A standard
format maps onto the native :class:`~ocdbt_py.checkpoint.manager.StepNameFormat`.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
import re
from collections.abc import Iterator
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from ocdbt_py.checkpoint.layout import COMMIT_MARKER
from ocdbt_py.checkpoint.layout import step_metadata as read_step_doc
from ocdbt_py.checkpoint.manager.naming import StepNameFormat
from ocdbt_py.checkpoint.meta import list_steps
from ocdbt_py.errors import NotFoundError, OcdbtError, UnsupportedError
from ocdbt_py.kvstore import open_kvstore

__all__ = ["TMP_DIR_SUFFIX", "Metadata", "NameFormat", "standard_name_format", "build_step_path",
           "get_save_directory", "step_from_checkpoint_name", "checkpoint_steps", "checkpoint_steps_paths",
           "any_checkpoint_step", "latest_step_metadata", "find_step_path", "is_path_temporary",
           "is_path_finalized", "all_temporary_paths", "TemporaryPath", "native_format"]

TMP_DIR_SUFFIX = ".orbax-checkpoint-tmp"
PathLike = str | os.PathLike[str]


def _path(p: PathLike) -> Any:
    """A ``pathlib.Path`` for local paths, the URL string otherwise."""
    s = os.fspath(p)
    return s if "://" in s and not s.startswith("file://") else pathlib.Path(s.removeprefix("file://"))


def _join(base: PathLike, name: str) -> Any:
    b = _path(base)
    return b / name if isinstance(b, pathlib.Path) else f"{b.rstrip('/')}/{name}"


@dataclasses.dataclass(frozen=True)
class Metadata:
    """A step found under a root: ``step`` and its ``path``."""

    step: int
    path: Any

    def _stamp(self, field: str) -> int | None:
        """A timestamp of the step's ``_CHECKPOINT_METADATA`` (``None`` without one)."""
        try:
            doc = read_step_doc(open_kvstore(os.fspath(self.path), read_only=True))
        except (OcdbtError, OSError):
            return None
        value = doc.get(field) if isinstance(doc, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def init_timestamp_nsecs(self) -> int | None:
        """When the step's save began (nanoseconds since the epoch), from ``_CHECKPOINT_METADATA``."""
        return self._stamp("init_timestamp_nsecs")

    @property
    def commit_timestamp_nsecs(self) -> int | None:
        """When the step was committed (nanoseconds since the epoch), from ``_CHECKPOINT_METADATA``."""
        return self._stamp("commit_timestamp_nsecs")

    @property
    def commit_timestamp(self) -> datetime.datetime:
        """When the step was committed, in UTC: the recorded commit time, else the
        directory's modification time."""
        ns = self.commit_timestamp_nsecs
        p = self.path
        if ns is not None:
            seconds = ns / 1e9
        else:
            seconds = p.stat().st_mtime if isinstance(p, pathlib.Path) else datetime.datetime.now().timestamp()
        return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)


MetadataT = TypeVar("MetadataT", bound=Metadata, covariant=True)


@runtime_checkable
class NameFormat(Protocol, Generic[MetadataT]):
    """Names steps and finds them under a root (uncommitted steps are not found)."""

    def build_name(self, step: int) -> str:
        """The directory name of ``step``."""
        ...

    def find_all(self, base_path: PathLike) -> Iterator[MetadataT]:
        """Every committed step under ``base_path``."""
        ...

    def find_step(self, base_path: PathLike, step: int) -> MetadataT:
        """``step`` under ``base_path``, or ``ValueError``."""
        ...


@dataclasses.dataclass(frozen=True)
class _StandardNameFormat:
    """``[<step_prefix>_]<step>``, zero-padded to ``step_format_fixed_length`` digits."""

    step_prefix: str | None = None
    step_format_fixed_length: int | None = None
    single_host_load_and_broadcast: bool = False
    temporary_path_cls: Any = None
    atomicity_options: Any = None

    def __str__(self) -> str:
        return f'StandardNameFormat("{self.build_name(1234)}")'

    def native(self) -> StepNameFormat:
        """The native format with the same names."""
        return StepNameFormat(self.step_prefix, self.step_format_fixed_length)

    def build_name(self, step: int) -> str:
        """``[prefix_]`` and the (padded) step."""
        return self.native().name(step)

    def find_all(self, base_path: PathLike) -> Iterator[Metadata]:
        """The committed steps of this format under ``base_path``, oldest first."""
        fmt = self.native()
        try:
            found = list_steps(base_path)
        except NotFoundError:
            return iter([])
        out = []
        for info in found:
            step = fmt.parse(info.name)
            if step is not None:
                out.append(Metadata(step, _join(base_path, info.name)))
        return iter(out)

    def find_step(self, base_path: PathLike, step: int) -> Metadata:
        """``step``'s metadata, or ``ValueError`` when it is not committed there."""
        for m in self.find_all(base_path):
            if m.step == step:
                return m
        raise ValueError(f"No step path found with name={self.build_name(step)}, NameFormat={self} for "
                         f"step={step} under {base_path}.")


def standard_name_format(*, step_prefix: str | None = None, step_format_fixed_length: int | None = None,
                         single_host_load_and_broadcast: bool = False, temporary_path_cls: Any = None,
                         atomicity_options: Any = None) -> Any:
    """Orbax's standard step names (``23``, ``0023``, ``step_23``, ``step_0023``)."""
    return _StandardNameFormat(step_prefix, step_format_fixed_length, single_host_load_and_broadcast,
                               temporary_path_cls, atomicity_options)


def native_format(fmt: Any) -> StepNameFormat:
    """The native :class:`StepNameFormat` of a standard (or native) name format; an
    ``UnsupportedError`` for other ``NameFormat`` implementations."""
    if isinstance(fmt, StepNameFormat):
        return fmt
    if isinstance(fmt, _StandardNameFormat):
        return fmt.native()
    prefix = getattr(fmt, "step_prefix", None)
    length = getattr(fmt, "step_format_fixed_length", None)
    if type(fmt).__name__ == "_StandardNameFormat":  # Orbax's own standard format object
        return StepNameFormat(prefix, length)
    raise UnsupportedError(f"step_name_format {fmt!r}: only standard name formats ([prefix_]step, optionally "
                           "zero-padded; ocp.step.standard_name_format) are supported")


def build_step_path(base_path: PathLike, name_format: Any, step: int) -> Any:
    """``base_path / name_format.build_name(step)``."""
    return _join(base_path, name_format.build_name(step))


def get_save_directory(step: int, directory: PathLike, name: str | None = None, step_prefix: str | None = None,
                       override_directory: PathLike | None = None, step_format_fixed_length: int | None = None,
                       step_name_format: Any = None) -> Any:
    """The directory of ``step`` (and of item ``name`` in it) under ``directory``."""
    if directory is None:
        raise ValueError("Directory cannot be None.")
    if override_directory is not None:
        result = _path(override_directory)
    else:
        fmt = step_name_format or standard_name_format(step_prefix=step_prefix,
                                                       step_format_fixed_length=step_format_fixed_length)
        result = build_step_path(directory, fmt, step)
    return _join(result, name) if name is not None else result


def step_from_checkpoint_name(name: str) -> int:
    """The step of a step directory name (``42``, ``ckpt_42``, ``000042``, and temporary
    ``42.orbax-checkpoint-tmp-<n>`` names)."""
    name = name.split(TMP_DIR_SUFFIX, 1)[0]
    if name.isdigit():
        return int(name)
    m = re.fullmatch(r"(.+)_(\d+)", name)
    if m is None:
        raise ValueError(f"Unrecognized name format: {name}.")
    return int(m.group(2))


def checkpoint_steps(checkpoint_dir: PathLike, single_host_load_and_broadcast: bool = False) -> list[int]:
    """The finalized steps under a manager root, oldest first."""
    try:
        return [s.step for s in list_steps(checkpoint_dir)]
    except NotFoundError:
        return []


def checkpoint_steps_paths(checkpoint_dir: PathLike) -> list[Any]:
    """The finalized step directories under a manager root."""
    try:
        return [_join(checkpoint_dir, s.name) for s in list_steps(checkpoint_dir)]
    except NotFoundError:
        return []


def any_checkpoint_step(checkpoint_dir: PathLike) -> int | None:
    """Some finalized step, or ``None``."""
    steps = checkpoint_steps(checkpoint_dir)
    return steps[-1] if steps else None


def latest_step_metadata(root_path: PathLike, name_format: Any) -> Metadata | None:
    """The newest committed step of ``name_format`` under ``root_path``, or ``None``."""
    found = sorted(name_format.find_all(root_path), key=lambda m: m.step)
    return found[-1] if found else None


def find_step_path(base_path: PathLike, name_format: Any, *, step: int, include_uncommitted: bool = False) -> Any:
    """The path of ``step`` (``ValueError`` when it is not there)."""
    if include_uncommitted:
        return build_step_path(base_path, name_format, step)
    return name_format.find_step(base_path, step).path


def is_path_temporary(path: PathLike) -> bool:
    """Whether ``path`` is a temporary (unfinished) checkpoint directory."""
    return TMP_DIR_SUFFIX in os.path.basename(os.fspath(path).rstrip("/"))


def is_path_finalized(path: PathLike) -> bool:
    """Whether the checkpoint at ``path`` is committed."""
    if is_path_temporary(path):
        return False
    kv = open_kvstore(os.fspath(path), read_only=True)
    return kv.exists(COMMIT_MARKER) or kv.exists("_CHECKPOINT_METADATA")


@dataclasses.dataclass(frozen=True)
class TemporaryPath:
    """An unfinished checkpoint directory: ``get()`` is its path, ``get_final()`` the path it
    will have once committed (as Orbax's temporary-path objects)."""

    path: Any

    def get(self) -> Any:
        """The temporary directory."""
        return self.path

    def get_final(self) -> Any:
        """The directory it becomes when committed."""
        name = os.path.basename(os.fspath(self.path)).split(TMP_DIR_SUFFIX, 1)[0]
        return _join(os.path.dirname(os.fspath(self.path)), name)

    def __fspath__(self) -> str:
        return os.fspath(self.path)


def all_temporary_paths(root_directory: PathLike, **ignored: Any) -> list[TemporaryPath]:
    """The unfinished (temporary) checkpoint directories directly under ``root_directory``."""
    root = _path(root_directory)
    if not isinstance(root, pathlib.Path):
        kv = open_kvstore(os.fspath(root_directory), read_only=True)
        names = {k.split("/", 1)[0] for k in kv.list("")}
        return [TemporaryPath(_join(root, n)) for n in sorted(names) if TMP_DIR_SUFFIX in n]
    if not root.is_dir():
        return []
    return [TemporaryPath(p) for p in sorted(root.iterdir()) if TMP_DIR_SUFFIX in p.name]
