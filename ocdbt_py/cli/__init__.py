"""The ``ocdbt`` command-line tool: inspect and check OCDBT databases and Orbax checkpoints.

Usage (``ocdbt --help`` and ``ocdbt COMMAND --help`` for details)::

    ocdbt ls URL [--prefix P] [--version V] [-l]
    ocdbt get URL KEY [-o FILE] [--hex | --escaped] [--version V]
    ocdbt info URL [--version V]
    ocdbt versions URL
    ocdbt verify URL [--latest | --version V] [--max-problems N]
    ocdbt tree URL [--step N] [--item NAME]
    ocdbt steps ROOT
    ocdbt export URL OUT.safetensors|OUT.npz
    ocdbt put URL KEY VALUE [--create] / ocdbt rm URL KEY... / ocdbt gc URL [--keep-versions N]
    ocdbt cp SRC DST [--ocdbt | --no-ocdbt] [--zarr3 | --zarr2] [--chunk-byte-size N]
             [--target-data-file-size N] [--compression zstd:L|none] [--dtype D]
             [--include/--exclude GLOB] [--steps N,M] [--resume] [--verify]
    ocdbt stats|du|report|diff|import ...  (see each command's --help)

Every command also takes ``--json`` (one JSON document on stdout), ``-S/--storage-option
K=V`` (repeatable, passed to fsspec), ``--quiet`` (nothing on stderr but errors), ``--debug``
(tracebacks) and ``--timeout SECONDS`` (how long an object store may take to answer).
``URL`` is a local path or any fsspec URL.  An Orbax checkpoint item directory is a database
(its ``manifest.ocdbt``); pointing at a step directory lists the item directories to choose
from.  Keys are shown as described in :mod:`ocdbt_py.keys` (``\\xNN`` escapes for bytes that
are not printable UTF-8, ``\\\\`` for a backslash); ``--json`` output gives ``key_hex`` too.

Exit status: 0 success, 1 error or a failed ``verify`` (a path that does not exist is
``error: URL does not exist``, for every command), 2 usage error (bad arguments, or a
location that holds item databases rather than being one: the message names the fix), 130
interrupted.  Errors are one line on stderr; ``--debug`` shows tracebacks.

Adding a subcommand
-------------------
Create a module ``ocdbt_py/cli/cmd_<name>.py`` exposing ``register(subparsers)``.  The
application (:mod:`ocdbt_py.cli.app`) discovers every ``cmd_*`` module of this package,
imports it and calls ``register`` with the ``argparse`` subparsers object, in module-name
order.  ``register`` adds its parser and sets the function that runs it::

    def register(subparsers):
        p = subparsers.add_parser("name", help="one line", description="...")
        add_location(p)                      # URL + -S, --timeout, --json, --quiet, --debug
        p.set_defaults(func=run)

    def run(args) -> int:                    # returns the exit status
        db = open_database(args)             # ocdbt_py.cli.locate
        ...

A location that is an output, or that ``--create`` may make, is declared with
``add_location(p, dest=..., must_exist=False)``; every other location is checked before
``run`` is called.  ``tests/cli/test_cli_grammar.py`` checks every registered command.

Keep module import cheap: import heavy modules (numpy, the store, codecs) inside ``run``.
Shared helpers: :mod:`ocdbt_py.cli.options` (common arguments), :mod:`ocdbt_py.cli.locate`
(opening a database with helpful errors), :mod:`ocdbt_py.cli.output` (JSON and human
formatting), :mod:`ocdbt_py.keys` (key escaping), :mod:`ocdbt_py.cli.progress`.  Raise
:class:`ocdbt_py.cli.errors.CliError` (exit 1) or :class:`~ocdbt_py.cli.errors.UsageError`
(exit 2) for user-facing failures; :class:`~ocdbt_py.errors.OcdbtError` is reported as a
one-line error too.  Two modules must not register the same command name (a later module
replacing a stub should delete the stub's module).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from ocdbt_py.cli.app import run
from ocdbt_py.cli.locate import ABANDONED

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tool with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    status = run(argv)
    # the program itself (not a caller in this process), and a storage call still hangs in some
    # library thread: do not wait for it
    if argv is None and ABANDONED.is_set():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)
    return status
