"""The ``ocdbt`` application: builds the parser from the ``cmd_*`` modules and runs a command.

See :mod:`ocdbt_py.cli` for the subcommand convention.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import traceback
from collections.abc import Sequence

from ocdbt_py.cli.errors import CliError
from ocdbt_py.cli.options import add_common

__all__ = ["build_parser", "command_modules", "run"]

PROG = "ocdbt"


def command_modules() -> list[str]:
    """Names of the ``ocdbt_py.cli.cmd_*`` modules, sorted."""
    here = os.path.dirname(os.path.abspath(__file__))
    names = [m.name for m in pkgutil.iter_modules([here]) if m.name.startswith("cmd_")]
    return [f"{__package__}.{n}" for n in sorted(names)]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every discovered subcommand registered."""
    from ocdbt_py import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect and check OCDBT databases (TensorStore's format) and Orbax "
        "checkpoints on any fsspec filesystem.",
        epilog="Exit status: 0 success, 1 error or failed verify, 2 usage error. "
        "Run 'ocdbt COMMAND --help' for a command's options.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"%(prog)s {__version__}")
    add_common(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in command_modules():
        importlib.import_module(name).register(sub)
    return parser


def _say(message: str) -> None:
    try:
        sys.stderr.write(f"{PROG}: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _safe_stdout() -> None:
    """Never crash printing keys on a terminal that is not UTF-8: escape what it cannot show."""
    from ocdbt_py.keys import set_ascii_only

    stream = sys.stdout
    enc = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    set_ascii_only(enc != "utf8")
    if enc != "utf8" and hasattr(stream, "reconfigure"):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (ValueError, OSError, TypeError):
            pass


def run(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command; returns the exit status (never raises, but
    ``--debug`` prints tracebacks)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(args_list)
        except SystemExit as e:  # --help, --version, usage errors
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        debug = bool(getattr(args, "debug", False))
        _safe_stdout()
        status = args.func(args)
        sys.stdout.flush()
        return int(status or 0)
    except CliError as e:
        if debug:
            traceback.print_exc()
        _say(str(e))
        return e.status
    except BrokenPipeError:
        # the reader went away (ocdbt ls ... | head): stop quietly
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 141
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except Exception as e:
        from ocdbt_py.errors import OcdbtError

        if debug:
            traceback.print_exc()
        if isinstance(e, OcdbtError):
            _say(f"error: {e}")
        elif isinstance(e, OSError):
            _say(f"error: {e.strerror or e}" + (f": {e.filename}" if e.filename else ""))
        else:
            _say(f"internal error: {type(e).__name__}: {e} (rerun with --debug for a traceback)")
        return 1
