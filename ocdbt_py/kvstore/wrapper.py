"""The base of every store that presents another store: :class:`WrapperStore`.

A wrapper (a view below a prefix, an opt-in single-writer lock, a fault-injecting or
latency-adding test store, a read cache) changes a few operations of the store it wraps and
should keep everything else, the fast paths included.  :class:`WrapperStore` forwards every
public member of :class:`~ocdbt_py.kvstore.base.KvStore` (primitives, optional methods and
capabilities alike) to ``base`` unless the wrapper overrides it, so a capability added to
:class:`KvStore` later reaches every wrapper without touching it.

The forwarders are made from :class:`KvStore`'s own signatures, once, at import:

* a parameter named ``key`` goes through :meth:`WrapperStore._inner` (``""`` where the
  member's default is ``""``, meaning the store's root, through ``_inner(key, root=True)``);
  ``prefix`` through :meth:`_inner_prefix`; ``start``/``stop`` (listing bounds) through
  :meth:`_inner_bound`; ``requests`` (batch entries whose first item is a key) key by key;
* a member whose result holds keys (:meth:`list`, :meth:`list_sized`) maps them back with
  :meth:`_outer`; a wrapper that renames keys and gains a new member returning keys overrides it.

A wrapper whose capability would read or write *around* it (a fault injector must see every
write, a cache must not be bypassed) names it in :attr:`WrapperStore.withheld`: that member
keeps :class:`KvStore`'s default, which is always correct (no fast path).
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from ocdbt_py.kvstore.base import ByteRange, KvStore

__all__ = ["WrapperStore", "forwarded_members", "install_forwarders"]

#: members of KvStore a wrapper handles itself, never through the generated forwarders
_OWN = frozenset({"url", "read_only"})


def forwarded_members() -> list[str]:
    """Every public member of :class:`KvStore` that :class:`WrapperStore` forwards."""
    return sorted(n for n, m in vars(KvStore).items()
                  if not n.startswith("_") and n not in _OWN and (callable(m) or isinstance(m, property)))


class WrapperStore(KvStore):
    """Presents ``base``: every member not overridden here or in a subclass goes to ``base``.

    Subclasses that rename keys set :attr:`renames_keys` and override :meth:`_inner`,
    :meth:`_inner_prefix`, :meth:`_inner_bound` and :meth:`_outer`; subclasses that must not
    be bypassed name the capabilities they keep at :class:`KvStore`'s default in
    :attr:`withheld`.
    """

    #: members that keep KvStore's default (they would read or write around this wrapper)
    withheld: ClassVar[frozenset[str]] = frozenset()
    #: whether keys of this store differ from the wrapped store's (a prefix view)
    renames_keys: ClassVar[bool] = False

    def __init__(self, base: KvStore):
        self.base = base
        self.read_only = base.read_only

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        unknown = cls.withheld - set(forwarded_members())
        if unknown:
            raise TypeError(f"{cls.__name__}.withheld names no KvStore member: {sorted(unknown)}")
        for name in cls.withheld:
            if name not in vars(cls):
                setattr(cls, name, vars(KvStore)[name])

    @property
    def url(self) -> str:
        return self.base.url

    # -- key mapping (identity unless the wrapper renames keys) -----------------------------
    def _inner(self, key: str, root: bool = False) -> str:
        """The wrapped store's key for ``key`` (``root``: ``""`` means the store's root)."""
        return key

    def _inner_prefix(self, prefix: str) -> str:
        """The wrapped store's listing prefix for ``prefix``."""
        return prefix

    def _inner_bound(self, bound: str | None) -> str | None:
        """The wrapped store's listing bound for ``bound`` (``None``: unbounded)."""
        return bound

    def _outer(self, key: str) -> str:
        """This store's key for the wrapped store's ``key``."""
        return key

    # -- the primitives (written out: the hot path, and what type checkers see) -------------
    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        return self.base.get(self._inner(key), byte_range)

    # -- members whose results hold keys ----------------------------------------------------
    def list(self, prefix: str = "", *, start: str | None = None, stop: str | None = None) -> Iterator[str]:
        keys = self.base.list(self._inner_prefix(prefix), start=self._inner_bound(start),
                              stop=self._inner_bound(stop))
        if not self.renames_keys:
            return keys
        return (self._outer(k) for k in keys)

    def list_sized(self, prefix: str = "") -> Iterator[tuple[str, int | None]]:
        entries = self.base.list_sized(self._inner_prefix(prefix))
        if not self.renames_keys:
            return entries
        return ((self._outer(k), n) for k, n in entries)


def _map_requests(self: WrapperStore, requests: Any) -> list[Any]:
    return [self._inner(r) if isinstance(r, str) else (self._inner(r[0]), *r[1:]) for r in requests]


def _mapper(param: inspect.Parameter) -> Callable[[WrapperStore, Any], Any] | None:
    if param.name == "key":
        root = param.default == ""
        return lambda self, k: self._inner(k, root=root)
    if param.name == "prefix":
        return lambda self, p: self._inner_prefix(p)
    if param.name in ("start", "stop"):
        return lambda self, b: self._inner_bound(b)
    if param.name == "requests":
        return _map_requests
    return None


def _forwarder(name: str, member: Any) -> Any:
    if isinstance(member, property):
        return property(lambda self: getattr(self.base, name), doc=member.__doc__)
    params = list(inspect.signature(member).parameters.values())[1:]
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    positional = [_mapper(p) for p in pos]
    by_name = {p.name: m for p in params if (m := _mapper(p)) is not None}

    def forward(self: WrapperStore, *args: Any, **kw: Any) -> Any:
        if self.renames_keys and by_name:
            full = list(args)
            for p in pos[len(args):]:  # defaults too are this view's keys ("" = its root)
                if p.name in kw:
                    full.append(kw.pop(p.name))
                elif p.default is not p.empty:
                    full.append(p.default)
                else:
                    break
            args = tuple(a if m is None else m(self, a) for m, a in zip(positional, full)) + tuple(full[len(pos):])
            kw = {k: v if k not in by_name else by_name[k](self, v) for k, v in kw.items()}
        return getattr(self.base, name)(*args, **kw)

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = member.__doc__
    return forward


def install_forwarders() -> list[str]:
    """Give :class:`WrapperStore` a forwarder for every :class:`KvStore` member it lacks (run
    at import; returns the names added)."""
    added = []
    for name in forwarded_members():
        if name not in vars(WrapperStore):
            setattr(WrapperStore, name, _forwarder(name, vars(KvStore)[name]))
            added.append(name)
    abc.update_abstractmethods(WrapperStore)
    return added


install_forwarders()
