"""The ``meshtop`` command line: ``run``, ``record``, ``watch``, ``ls``, ``replay``, ``summary``, ``compare``,
``export``, ``plan`` and ``sweep``.

The parser is assembled here from the command families of :mod:`meshtop.tui.commands`, whose options are
defined once in :mod:`meshtop.tui.options`. Every error the user can fix is one line on stderr and exit
code 2; a job whose rank failed exits 1 naming the rank; an interrupted job exits 130.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from meshtop.probes.errors import MeshtopError
from meshtop.tui.commands.live import add_live_commands
from meshtop.tui.commands.planning import add_plan_commands
from meshtop.tui.commands.recordings import add_recording_commands
from meshtop.tui.commands.sessions import add_session_commands
from meshtop.tui.commands.watching import add_watch_command
from meshtop.tui.options import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, OneLineParser


def build_parser() -> argparse.ArgumentParser:
    """``meshtop`` and its commands, in the order ``meshtop --help`` lists them."""
    parser = OneLineParser(
        prog="meshtop", description="A terminal dashboard and profiler for distributed PyTorch LLM jobs."
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    add_live_commands(commands)
    add_watch_command(commands)
    add_session_commands(commands)
    add_recording_commands(commands)
    add_plan_commands(commands)
    return parser


def _interrupt_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def split_script(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """meshtop's own arguments, and the script command after the first ``--`` (``None`` without one)."""
    if "--" not in argv:
        return argv, None
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``meshtop ARGV`` (default: the process's arguments); its exit code."""
    every = list(sys.argv[1:] if argv is None else argv)
    own, script = split_script(every)
    parser = build_parser()
    args = parser.parse_args(own)
    if script is not None and args.command not in ("run", "record", "sweep"):
        parser.error(f"only run, record and sweep take a command after -- ({args.command} does not)")
    args.script, args.argv = script, every
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    try:
        return int(args.handler(args))
    except MeshtopError as error:
        print(f"meshtop: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("meshtop: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def entry() -> int:
    """The ``meshtop`` command: :func:`main`, then an exit that skips the interpreter's last full collection."""
    code = main()
    # Python's finalisation collects every object once more: some 0.7 s over torch's and pandas' objects, at the
    # end of every command, for nothing (the process frees them all as it goes). Frozen objects are left out.
    gc.freeze()
    return code


if __name__ == "__main__":
    sys.exit(entry())
