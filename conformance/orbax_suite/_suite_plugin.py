"""pytest plugin of the Orbax test-suite runner (loaded in its subprocesses with ``-p``).

Marks absl flags parsed (as Orbax's own conftest does), installs the drop-in import layer when
``OCDBT_SUITE_MODE=dropin``, and writes one JSON record per test to ``OCDBT_SUITE_RESULTS``:
outcome, the tail of the failure, the Orbax internal named by a ``ForeignOrbaxObjectError``
(``ocdbt_py.orbax`` refusing an object of Orbax's own), and the non-public Orbax names the test
took through the drop-in layer.
"""

from __future__ import annotations

import json
import os
import re
import sys
import types
from typing import Any

import _dropin

_records: dict[str, dict[str, Any]] = {}
_collect_errors: list[dict[str, str]] = []
_PRIVATE = re.compile(r"AttributeError: ([^\n]{0,160}?"
                      r"(?:ocdbt_py\.orbax|CheckpointManager|Checkpointer|CheckpointHandler)"
                      r"[^\n]{0,80}?) (?:has no attribute|does not have the attribute) '(_\w+)'")
_FOREIGN = re.compile(r"\[orbax-internal: ([\w.]+)\]")


def pytest_configure(config: Any) -> None:
    """absl flags parsed; the drop-in layer installed in drop-in mode."""
    from absl import flags  # Orbax's tests read absl flags

    flags.FLAGS.mark_as_parsed()
    _start_distributed()
    if os.environ.get("OCDBT_SUITE_MODE") == "dropin":
        _dropin.install()
        _watch_orbax()
        _watch_patches()


# Orbax's own save/restore machinery: a drop-in test that runs it (e.g. through
# test_utils.PyTreeCheckpointHandler, a subclass of Orbax's handler) tests Orbax, not ocdbt_py
_ORBAX_ENTRY_POINTS = [
    ("orbax.checkpoint._src.handlers.base_pytree_checkpoint_handler", "BasePyTreeCheckpointHandler"),
    ("orbax.checkpoint._src.handlers.pytree_checkpoint_handler", "PyTreeCheckpointHandler"),
    ("orbax.checkpoint._src.handlers.standard_checkpoint_handler", "StandardCheckpointHandler"),
    ("orbax.checkpoint._src.handlers.composite_checkpoint_handler", "CompositeCheckpointHandler"),
    ("orbax.checkpoint._src.handlers.json_checkpoint_handler", "JsonCheckpointHandler"),
    ("orbax.checkpoint._src.handlers.array_checkpoint_handler", "ArrayCheckpointHandler"),
    ("orbax.checkpoint._src.checkpointers.checkpointer", "Checkpointer"),
    ("orbax.checkpoint._src.checkpointers.async_checkpointer", "AsyncCheckpointer"),
    ("orbax.checkpoint.checkpoint_manager", "CheckpointManager"),
    ("orbax.checkpoint.experimental.emergency.checkpoint_manager", "CheckpointManager"),
]
_ORBAX_RAN: set[str] = set()


def _watch_orbax() -> None:
    """Wrap the save/restore methods of Orbax's handlers, checkpointers and managers so that a
    test running them is recorded."""
    import functools
    import importlib

    for mod_name, cls_name in _ORBAX_ENTRY_POINTS:
        try:
            cls = getattr(importlib.import_module(mod_name), cls_name)
        except (ImportError, AttributeError):
            continue
        for meth in ("save", "async_save", "restore", "metadata"):
            fn = cls.__dict__.get(meth)
            if fn is None or not callable(fn):
                continue
            label = f"{mod_name}.{cls_name}.{meth}"

            def wrap(fn: Any, label: str) -> Any:
                if _is_coroutine(fn):
                    @functools.wraps(fn)
                    async def awrapped(*a: Any, **k: Any) -> Any:
                        _ORBAX_RAN.add(label)
                        return await fn(*a, **k)

                    return awrapped

                @functools.wraps(fn)
                def wrapped(*a: Any, **k: Any) -> Any:
                    _ORBAX_RAN.add(label)
                    return fn(*a, **k)

                return wrapped

            setattr(cls, meth, wrap(fn, label))


_PATCHED: set[str] = set()


def _watch_patches() -> None:
    """Record every ``unittest.mock`` patch a test makes whose target lives in Orbax's ``_src``
    internals (patches made by ``setUp`` or Orbax's test harness aside: they are the tests'
    environment, such as multihost barrier keys).  A test that steers behaviour through one
    (``gcs_utils.is_gcs_path``, a private callback of Orbax's manager,
    ``atomicity._create_tmp_directory``) tests Orbax's internals, which ``ocdbt_py.orbax``
    neither calls nor can be asked to."""
    import functools
    from unittest import mock

    init = mock._patch.__init__  # type: ignore[attr-defined]
    enter = mock._patch.__enter__  # type: ignore[attr-defined]

    @functools.wraps(init)
    def made(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        self._ocdbt_environment = _made_by_environment(sys._getframe(1))

    @functools.wraps(enter)
    def watched(self: Any) -> Any:
        if getattr(self, "_ocdbt_environment", False):  # the tests' environment, not a steer
            return enter(self)
        try:
            target = self.getter()
        except Exception:  # the patch itself reports a bad target
            return enter(self)
        if isinstance(target, types.ModuleType):
            where = target.__name__
        else:
            where = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', type(target).__name__)}"
        if where.startswith(_dropin.PREFIX + "._src."):  # the drop-in's stand-in for an Orbax _src module
            where = "orbax.checkpoint" + where[len(_dropin.PREFIX):]
        if where.startswith("orbax.checkpoint._src.") and not where.startswith("orbax.checkpoint._src.testing."):
            _PATCHED.add(f"{where}.{self.attribute}")
        return enter(self)

    mock._patch.__init__ = made  # type: ignore[attr-defined]
    mock._patch.__enter__ = watched  # type: ignore[attr-defined]


_HARNESS = ("orbax.checkpoint.test_utils", "orbax.checkpoint._src.testing.")


def _made_by_environment(frame: Any) -> bool:
    """Whether the code that made a patch (the first frame outside ``unittest.mock``, from
    ``frame`` up) is a test class's ``setUp`` or Orbax's test harness
    (``test_utils.barrier_compatible_test`` patches multihost barrier keys around every test
    of a class)."""
    while frame is not None and frame.f_globals.get("__name__") == "unittest.mock":
        frame = frame.f_back
    if frame is None:
        return False
    return (frame.f_code.co_name in ("setUp", "setUpClass", "asyncSetUp")
            or str(frame.f_globals.get("__name__", "")).startswith(_HARNESS))


def _is_coroutine(fn: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)


def _start_distributed() -> None:
    """A one-process JAX distributed service: Orbax's ``MultiProcessTest`` cases wait at its
    barriers (Orbax's own runner starts it through ``multiprocess_test.main``)."""
    import socket

    import jax  # the tests use JAX on 8 CPU devices

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=1, process_id=0)


def pytest_runtest_setup(item: Any) -> None:
    """Start recording the internals this test takes."""
    _dropin.INTERNALS_USED.clear()
    _ORBAX_RAN.clear()
    _PATCHED.clear()


def pytest_runtest_logreport(report: Any) -> None:
    """Fold the setup/call/teardown reports of a test into one record."""
    rec = _records.setdefault(report.nodeid, {"outcome": "passed", "error": "", "internal": None, "uses": []})
    if report.failed and rec["outcome"] != "failed":
        rec["outcome"] = "failed"
        text = report.longreprtext or ""
        m = _FOREIGN.search(text) if "ForeignOrbaxObjectError" in text else None
        if m and m.group(1) in _dropin.MISSING_PUBLIC:
            rec["missing_public"] = _dropin.MISSING_PUBLIC[m.group(1)]
        elif m:
            rec["internal"] = m.group(1)
        else:
            p = _PRIVATE.search(text)
            if p:  # the test reaches into a private attribute of ocdbt_py.orbax's objects
                rec["internal"] = f"private attribute {p.group(2)} of {p.group(1)}"
        lines = [ln for ln in text.splitlines() if ln.startswith("E ")]
        rec["error"] = "\n".join(lines[-6:])[-1500:] or text[-1500:]
    elif report.skipped and rec["outcome"] == "passed":
        rec["outcome"] = "skipped"
    if report.when == "teardown":
        rec["uses"] = sorted(_dropin.INTERNALS_USED)
        rec["orbax_ran"] = sorted(_ORBAX_RAN)
        rec["patched"] = sorted(_PATCHED)


def pytest_collectreport(report: Any) -> None:
    """Record a file that could not be collected."""
    if report.failed:
        _collect_errors.append({"nodeid": report.nodeid, "error": (report.longreprtext or "")[-3000:]})


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    """Write the records."""
    out = os.environ.get("OCDBT_SUITE_RESULTS")
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"tests": _records, "collect_errors": _collect_errors}, f, indent=1)
