"""The ``ocdbt`` application: builds the parser from the ``cmd_*`` modules and runs a command.

See :mod:`ocdbt_py.cli` for the subcommand convention.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from ocdbt_py import __version__
from ocdbt_py.cli.errors import CliError, UsageError
from ocdbt_py.cli.locate import check_locations
from ocdbt_py.cli.options import add_common
from ocdbt_py.errors import OcdbtError
from ocdbt_py.keys import set_ascii_only

__all__ = ["Parser", "build_parser", "command_modules", "subcommands", "run"]

PROG = "ocdbt"


class Parser(argparse.ArgumentParser):
    """argparse with usage errors that end by naming the help to read (exit status 2).

    Subcommand parsers are of this class too; an option a command defines again (say its own
    ``--quiet``) replaces the common one rather than break every command at start-up.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("conflict_handler", "resolve")
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n(run '{self.prog} --help' for the options)\n")


def command_modules() -> list[str]:
    """Names of the ``ocdbt_py.cli.cmd_*`` modules, sorted."""
    here = os.path.dirname(os.path.abspath(__file__))
    names = [m.name for m in pkgutil.iter_modules([here]) if m.name.startswith("cmd_")]
    return [f"{__package__}.{n}" for n in sorted(names)]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every discovered subcommand registered."""

    parser = Parser(
        prog=PROG,
        description="Inspect and check OCDBT databases (TensorStore's format) and Orbax "
        "checkpoints on any fsspec filesystem.",
        epilog="Every command takes --json (JSON on stdout), -S K=V (fsspec storage options), "
        "--quiet, --debug and --timeout SECONDS (object stores). Exit status: 0 success, 1 error, "
        "failed verify or differences found, 2 usage error. Run 'ocdbt COMMAND --help' for a "
        "command's options.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"%(prog)s {__version__}")
    add_common(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in command_modules():
        importlib.import_module(name).register(sub)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The registered subcommands of ``parser`` (from :func:`build_parser`) by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _quiet_logging(debug: bool) -> None:
    """Third-party libraries (gcsfs, aiohttp, azure) log tracebacks of failed requests: show them
    only with ``--debug``; otherwise our one-line error says what failed."""
    root = logging.getLogger()
    if debug:
        if not root.handlers:
            logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")
    elif not root.handlers:
        root.addHandler(logging.NullHandler())  # no "last resort" printing to stderr


def _one_line(text: str) -> str:
    """The first line of a (third-party) message, noting that there was more."""
    first, _, rest = text.strip().partition("\n")
    return first + (" (more with --debug)" if rest.strip() else "")


def _say(message: str) -> None:
    try:
        sys.stderr.write(f"{PROG}: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _safe_stdout() -> None:
    """Never crash printing keys on a terminal that is not UTF-8: escape what it cannot show."""

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
            args, extra = parser.parse_known_args(args_list)
            if extra:  # reported by the subcommand's parser, which names its own --help
                target = subcommands(parser).get(getattr(args, "command", None) or "", parser)
                target.error(f"unrecognized arguments: {' '.join(extra)}")
        except SystemExit as e:  # --help, --version, usage errors
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
        debug = bool(getattr(args, "debug", False))
        _quiet_logging(debug)
        _safe_stdout()
        check_locations(args)
        status = args.func(args)
        sys.stdout.flush()
        return int(status or 0)
    except CliError as e:
        if debug:
            traceback.print_exc()
        _say(str(e) if isinstance(e, UsageError) else f"error: {e}")
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
        if debug:
            traceback.print_exc()
        if isinstance(e, OcdbtError):
            _say(f"error: {_one_line(str(e))}")
        elif isinstance(e, OSError):
            _say(f"error: {_one_line(str(e.strerror or e))}" + (f": {e.filename}" if e.filename else ""))
        else:
            _say(f"internal error: {type(e).__name__}: {e} (rerun with --debug for a traceback)")
        return 1
