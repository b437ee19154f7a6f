"""The command of a test terminal's pane: ``python exit_keeper.py EXIT_FILE COMMAND...``.

Runs COMMAND in the terminal, and writes ``EXIT=<code>`` to EXIT_FILE when it ends (a signal's death as a
shell gives it, 128 + the signal), even when the terminal is gone by then: as the terminal's session leader it
takes the hang-up the kernel sends the leader, passes it on to COMMAND (what a shell's death would do) and
stays to see how COMMAND ends. That exit code is what says whether meshtop, its terminal lost, still ended
cleanly: a write to the dead terminal that fails after the dashboard closed shows only there.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    exit_file, command = Path(argv[0]), argv[1:]
    child = subprocess.Popen(command)
    signal.signal(signal.SIGHUP, lambda signum, frame: child.send_signal(signal.SIGHUP))
    code = child.wait()
    exit_file.write_text(f"EXIT={128 - code if code < 0 else code}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
