"""``ocp.logging``: the checkpoint loggers a manager takes (``logger=``).

``StandardLogger`` writes each entry (a dict of step statistics) to Python's ``logging`` at
INFO; ``CloudLogger`` does the same under its ``CloudLoggerOptions.job_name`` (ocdbt_py sends
nothing to Google Cloud Logging: no cloud client is a dependency); ``CompositeLogger`` fans
out to several.  The manager logs one entry per save and per restore.
"""

from __future__ import annotations

import dataclasses
import logging as _pylogging
from typing import Any, Protocol

from ocdbt_py.orbax import step_statistics

__all__ = ["AbstractLogger", "StandardLogger", "CloudLogger", "CloudLoggerOptions", "CompositeLogger",
           "step_statistics"]

_log = _pylogging.getLogger(__name__)


class AbstractLogger(Protocol):
    """What a checkpoint logger offers."""

    def log_entry(self, entry: dict[str, Any]) -> None:
        """Record one entry."""


class StandardLogger:
    """Each entry to Python's ``logging`` at INFO, as ``'[step statistics] {...}'``."""

    def log_entry(self, entry: dict[str, Any]) -> None:
        """Log ``entry``."""
        _log.info("[step statistics] %s", entry)


@dataclasses.dataclass
class CloudLoggerOptions:
    """Orbax's cloud logger options (``client`` and ``checkpoint_metadata`` are kept, unused)."""

    job_name: str = "orbax-checkpoint"
    logger_name: str = "orbax-checkpoint"
    client: Any = None
    checkpoint_metadata: Any = None


class CloudLogger:
    """Orbax's cloud logger, writing to Python's ``logging`` under the job name."""

    def __init__(self, options: CloudLoggerOptions | None = None):
        self.options = options or CloudLoggerOptions()

    def log_entry(self, entry: dict[str, Any]) -> None:
        """Log ``entry`` with the job name."""
        _log.info("[%s] %s", self.options.job_name, entry)


class CompositeLogger:
    """Several loggers: each entry goes to all of them."""

    def __init__(self, *loggers: Any):
        self.loggers = list(loggers)

    def log_entry(self, entry: dict[str, Any]) -> None:
        """Log ``entry`` with every logger."""
        for logger in self.loggers:
            logger.log_entry(entry)
