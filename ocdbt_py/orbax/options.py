"""Orbax's option dataclasses (``ocp.options``) that ``ocdbt_py.orbax`` accepts.

``AsyncOptions``, ``MultiprocessingOptions``, ``FileOptions`` and ``AtomicityOptions`` have
Orbax's fields and defaults; which of them take effect is listed in ``spec/orbax-api.md``
(the others are accepted and ignored, so scripts that pass them run unchanged).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

__all__ = ["AsyncOptions", "MultiprocessingOptions", "FileOptions", "AtomicityMode", "AtomicityOptions",
           "MemoryLimitOptions"]


@dataclasses.dataclass
class AsyncOptions:
    """Background-save settings; ``post_finalization_callback`` runs after each commit."""

    timeout_secs: int = 1200
    barrier_sync_fn: Callable[..., Any] | None = None
    post_finalization_callback: Callable[[], None] | None = None
    create_directories_asynchronously: bool = True


@dataclasses.dataclass
class MultiprocessingOptions:
    """Which process is primary (only 0 is supported for saving) and which take part; the
    emergency manager's ``coordination_timeout_secs`` (how long processes wait for each
    other) too: one class serves both of Orbax's (``ocp.options`` and ``emergency``)."""

    primary_host: int | None = 0
    active_processes: set[int] | None = None
    barrier_sync_key_prefix: str | None = None
    coordination_timeout_secs: int = 120


@dataclasses.dataclass(frozen=True)
class FileOptions:
    """Directory permissions (ignored: files get the process's umask)."""

    path_permission_mode: int | None = None
    skip_sync_file_validations: bool = False


class AtomicityMode(str, enum.Enum):
    """How a save becomes visible (ours: rename on local disks, commit file elsewhere)."""

    AUTO = "auto"
    COMMIT_FILE = "commit_file"
    ATOMIC_RENAME = "atomic_rename"


@dataclasses.dataclass(frozen=True)
class AtomicityOptions:
    """Atomicity settings (``mode`` is chosen by the storage; see ``spec/orbax.md``)."""

    mode: AtomicityMode = AtomicityMode.AUTO
    allow_legacy_atomic_rename: bool = False


@dataclasses.dataclass
class MemoryLimitOptions:
    """Save memory limits (ignored)."""

    max_transfer_concurrent_gb: int | None = None
