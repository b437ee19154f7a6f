"""On-demand stack dumps of every rank with py-spy."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from meshtop.probes.events import StackDump

DUMP_TIMEOUT_S = 20.0
PTRACE_HINT = (
    "ptrace is not permitted here: run meshtop as root, or allow it with "
    "`sysctl kernel.yama.ptrace_scope=0`, or give the container CAP_SYS_PTRACE"
)


def py_spy_executable() -> str | None:
    """py-spy beside this Python (the installed dependency), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def dump_stack(rank: int, pid: int, *, executable: str | None = None) -> StackDump:
    """py-spy's dump of ``pid`` (every thread, with locals off), or the reason there is none."""
    executable = executable or py_spy_executable()
    if executable is None:
        return StackDump(
            rank=rank, pid=pid, wall_ns=time.time_ns(), text=None, error="py-spy is not installed (pip install py-spy)"
        )
    try:
        done = subprocess.run(
            [executable, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=DUMP_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return StackDump(
            rank=rank,
            pid=pid,
            wall_ns=time.time_ns(),
            text=None,
            error=f"py-spy did not finish within {DUMP_TIMEOUT_S:.0f} s",
        )
    except OSError as error:
        return StackDump(
            rank=rank,
            pid=pid,
            wall_ns=time.time_ns(),
            text=None,
            error=f"cannot run py-spy ({executable}): {error.strerror}",
        )
    if done.returncode == 0:
        return StackDump(rank=rank, pid=pid, wall_ns=time.time_ns(), text=done.stdout, error=None)
    message = (done.stderr.strip() or done.stdout.strip()).splitlines()
    first = message[0] if message else f"py-spy exited with code {done.returncode}"
    lowered = " ".join(message).lower()
    if "permission denied" in lowered or "operation not permitted" in lowered:
        first = f"py-spy cannot attach to rank {rank} (pid {pid}): {PTRACE_HINT}"
    return StackDump(rank=rank, pid=pid, wall_ns=time.time_ns(), text=None, error=first)


def dump_stacks(pids: dict[int, int]) -> list[StackDump]:
    """Dumps of every rank (``{rank: pid}``), taken in parallel, in rank order."""
    if not pids:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(pids))) as pool:
        dumps = pool.map(lambda item: dump_stack(*item), sorted(pids.items()))
        return list(dumps)
