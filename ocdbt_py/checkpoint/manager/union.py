"""The shared shape of ``AnyOf`` save and preservation policies: a flat tuple of policies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["PolicyUnion"]


class PolicyUnion:
    """Holds policies given one by one or in lists/tuples; each must have the method named by
    the subclass's ``method``."""

    method = ""
    kind = "policy"

    def __init__(self, *policies: Any):
        flat: list[Any] = []
        for p in policies:
            if isinstance(p, (list, tuple)):
                flat.extend(p)
            else:
                flat.append(p)
        if not flat:
            raise ValueError(f"{type(self).__name__} needs at least one {self.kind}")
        for p in flat:
            if not callable(getattr(p, self.method, None)):
                raise TypeError(f"{p!r} is not a {self.kind} (it has no {self.method} method)")
        self.policies: tuple[Any, ...] = tuple(flat)

    def walk(self) -> Iterator[Any]:
        """Every policy inside, nested unions of the same kind flattened."""
        for p in self.policies:
            if isinstance(p, type(self)):
                yield from p.walk()
            else:
                yield p

    def __iter__(self) -> Iterator[Any]:
        return iter(self.policies)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(p) for p in self.policies)})"


