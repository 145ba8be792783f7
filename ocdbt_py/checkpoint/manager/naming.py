"""Step directory names: ``[<prefix>_]<step>``, optionally zero-padded, as Orbax names them."""

from __future__ import annotations

import dataclasses
import re

__all__ = ["StepNameFormat"]

_TMP = ".orbax-checkpoint-tmp"


@dataclasses.dataclass(frozen=True)
class StepNameFormat:
    """How a manager names its step directories and recognises them when listing.

    ``StepNameFormat()`` gives plain integers (``12``); ``StepNameFormat("ckpt", 6)`` gives
    ``ckpt_000012``.  Parsing follows Orbax's standard format: with a fixed length, exactly
    that many digits, or more when the number has no leading zero (it outgrew the padding);
    without one, no leading zeros (except ``0`` itself).  Names of other managers sharing the
    root (another prefix) are not recognised.
    """

    prefix: str | None = None
    fixed_length: int | None = None

    def __post_init__(self) -> None:
        if self.prefix is not None and (not self.prefix or "/" in self.prefix or _TMP in self.prefix):
            raise ValueError(f"invalid step prefix {self.prefix!r}")
        if self.fixed_length is not None and not 1 <= self.fixed_length <= 32:
            raise ValueError(f"fixed_length must be between 1 and 32, not {self.fixed_length!r}")

    def name(self, step: int) -> str:
        """The directory name of ``step``."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"a step is a non-negative int, not {step!r}")
        digits = str(step).zfill(self.fixed_length) if self.fixed_length else str(step)
        return f"{self.prefix}_{digits}" if self.prefix else digits

    def parse(self, name: str) -> int | None:
        """The step of a directory name in this format, else ``None``."""
        if _TMP in name:
            return None
        if self.prefix:
            head = self.prefix + "_"
            if not name.startswith(head):
                return None
            digits = name[len(head):]
        else:
            digits = name
        if not digits or not digits.isascii() or not digits.isdigit():
            return None
        n = self.fixed_length
        if n:
            if len(digits) < n or (len(digits) > n and digits[0] == "0"):
                return None
        elif len(digits) > 1 and digits[0] == "0":
            return None
        return int(digits)

    @property
    def pattern(self) -> re.Pattern[str]:
        """A regular expression matching the names of this format."""
        head = re.escape(self.prefix + "_") if self.prefix else ""
        if self.fixed_length:
            return re.compile(rf"^{head}(?:[0-9]{{{self.fixed_length}}}|[1-9][0-9]{{{self.fixed_length},}})$")
        return re.compile(rf"^{head}(?:0|[1-9][0-9]*)$")
