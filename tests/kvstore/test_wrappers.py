"""Every wrapper store forwards every member of the wrapped store it does not override or
withhold, including a capability added to :class:`KvStore` after the wrappers were written."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ocdbt_py
from ocdbt_py.checkpoint.restore.reader import OverlayStore
from ocdbt_py.kvstore import MemoryStore, PrefixStore
from ocdbt_py.kvstore.base import ByteRange, KvStore
from ocdbt_py.kvstore.single_writer import SingleWriterStore
from ocdbt_py.kvstore.wrapper import WrapperStore, forwarded_members, install_forwarders
from ocdbt_py.testing.faults import FaultyStore
from ocdbt_py.testing.latency import LatencyStore

#: how to build each wrapper around ``base``; a new wrapper class must be added here
FACTORIES: dict[type[WrapperStore], Callable[[KvStore], WrapperStore]] = {
    PrefixStore: lambda b: PrefixStore(b, "inner/p"),
    SingleWriterStore: SingleWriterStore,
    FaultyStore: FaultyStore,
    LatencyStore: LatencyStore,
    OverlayStore: lambda b: OverlayStore(b, {}),
}

#: classes a wrapper could wrongly derive from directly
STORE_BASES = {"KvStore", "LocalStore", "FsspecStore", "MemoryStore"}

#: an argument for each parameter name KvStore's members use
ARGS: dict[str, Any] = {
    "key": "k", "prefix": "", "start": None, "stop": None, "requests": [("k", (0, 1))], "path": "/x",
    "value": b"v", "parts": [b"v"], "if_generation": None, "byte_range": None,
}


class Sentinel(KvStore):
    """Answers every member with a value that names it, and records the keys it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        self.calls.append(("get", (key,), {}))
        return "sentinel:get"  # type: ignore[return-value]

    def list(self, prefix: str = "", *, start: str | None = None, stop: str | None = None) -> Iterator[str]:
        self.calls.append(("list", (prefix,), {}))
        return iter([prefix + "sentinel:list"])

    def list_sized(self, prefix: str = "") -> Iterator[tuple[str, int | None]]:
        self.calls.append(("list_sized", (prefix,), {}))
        return iter([(prefix + "sentinel:list_sized", 1)])


def _answer(name: str, member: Any) -> Any:
    if isinstance(member, property):
        return property(lambda self: f"sentinel:{name}")

    def method(self: Sentinel, *args: Any, **kw: Any) -> Any:
        self.calls.append((name, args, kw))
        return f"sentinel:{name}"

    return method


def _sentinel_class() -> type[Sentinel]:
    members = {n: _answer(n, vars(KvStore)[n]) for n in forwarded_members() if n not in ("get", "list", "list_sized")}
    return type("SentinelStore", (Sentinel,), members)


def _all_wrappers() -> set[type[WrapperStore]]:
    out: set[type[WrapperStore]] = set()
    todo = [WrapperStore]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("ocdbt_py.") and sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


def _overridden(cls: type, name: str) -> bool:
    return any(name in vars(c) for c in cls.__mro__[: cls.__mro__.index(WrapperStore)])


def _call(obj: Any, name: str) -> Any:
    attr = vars(KvStore)[name]
    if isinstance(attr, property):
        return getattr(obj, name)
    params = list(inspect.signature(attr).parameters.values())[1:]
    args = [ARGS.get(p.name) for p in params if p.kind == p.POSITIONAL_OR_KEYWORD and p.default is p.empty]
    kw = {p.name: ARGS.get(p.name) for p in params if p.kind == p.KEYWORD_ONLY and p.default is p.empty}
    return getattr(obj, name)(*args, **kw)


def test_every_wrapper_has_a_factory() -> None:
    assert _all_wrappers() == set(FACTORIES)


@pytest.mark.parametrize("cls", sorted(FACTORIES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_wrapper_forwards_every_member_it_does_not_override(cls: type[WrapperStore]) -> None:
    base = _sentinel_class()()
    wrapper = FACTORIES[cls](base)
    forwarded = [n for n in forwarded_members() if n not in cls.withheld and not _overridden(cls, n)]
    assert forwarded, "nothing forwarded"
    for name in forwarded:
        got = _call(wrapper, name)
        if name in ("list", "list_sized"):  # key listings: the base's keys, as this view names them
            got = [k if isinstance(k, str) else k[0] for k in got]
            assert got == [f"sentinel:{name}"], (cls.__name__, name, got)
        else:
            assert got == f"sentinel:{name}", (cls.__name__, name, got)
        if not isinstance(inspect.getattr_static(KvStore, name), property):
            assert base.calls and base.calls[-1][0] == name, (cls.__name__, name)
    for name in cls.withheld:  # withheld members keep KvStore's behaviour, never the base's
        assert getattr(cls, name) is vars(KvStore)[name], (cls.__name__, name)


def test_prefix_view_maps_keys_of_forwarded_members() -> None:
    base = _sentinel_class()()
    view = PrefixStore(base, "inner/p")
    view.read_into([("a/b", 0, memoryview(bytearray(1)))])
    assert base.calls[-1][1][0][0][0] == "inner/p/a/b"
    view.exists("x")
    assert base.calls[-1] == ("exists", ("inner/p/x",), {})
    view.local_path()
    assert base.calls[-1] == ("local_path", ("inner/p",), {})
    view.delete_prefix("d/")
    assert base.calls[-1] == ("delete_prefix", ("inner/p/d/",), {})
    assert list(view.list("q/")) == ["q/sentinel:list"]
    with pytest.raises(ocdbt_py.errors.InvalidKeyError):
        view.size("../escape")


def test_new_capability_on_the_base_is_forwarded_by_every_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    """Declare a capability on KvStore as a new backend feature would; every wrapper forwards
    it (a property and a keyed method), without any wrapper being edited."""

    def shiny_path(self: KvStore, key: str = "") -> str | None:
        """A new keyed capability (default: nothing)."""
        return None

    monkeypatch.setattr(KvStore, "is_shiny", property(lambda self: False), raising=False)
    monkeypatch.setattr(KvStore, "shiny_path", shiny_path, raising=False)
    added = install_forwarders()
    try:
        assert sorted(added) == ["is_shiny", "shiny_path"]

        class Shiny(MemoryStore):
            is_shiny = True  # type: ignore[assignment]

            def shiny_path(self, key: str = "") -> str | None:
                return "shiny:" + key

        for cls, make in FACTORIES.items():
            wrapper: Any = make(Shiny())
            assert wrapper.is_shiny is True, cls.__name__
            want = "shiny:inner/p/k" if cls is PrefixStore else "shiny:k"
            assert wrapper.shiny_path("k") == want, cls.__name__
        assert PrefixStore(Shiny(), "inner/p").shiny_path() == "shiny:inner/p"  # type: ignore[attr-defined]
    finally:
        for name in added:
            delattr(WrapperStore, name)


def test_every_store_holding_a_base_store_is_a_wrapper() -> None:
    """A KvStore subclass in ocdbt_py whose constructor takes a ``base`` store derives from
    WrapperStore (so it cannot drop a capability by forgetting it)."""
    root = Path(ocdbt_py.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
            if node.name == "WrapperStore" or "WrapperStore" in bases or not bases & STORE_BASES:
                continue
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "__init__" and any(
                        a.arg == "base" for a in fn.args.args):
                    offenders.append(f"{path.relative_to(root)}:{node.name}")
    assert offenders == []
