"""torch's flight recorder, dumped from a rank when the launcher asks, for torch's own analyzer.

Every rank meshtop launches runs with torch's flight recorder on (:data:`FLIGHT_BUFFER` entries, set by the
launcher unless the user set ``TORCH_FR_BUFFER_SIZE``): the process group's backend records each
collective it issues (op, group, sizes, dtypes, sequence number) in a ring buffer. When the launcher wants
the records (a hang, or a stack dump asked for), it writes a new number into the request file of the
folder :data:`FLIGHT_ENV` names; each rank's shipper thread, which keeps running while the training
thread is blocked in a collective, sees it at its next shipment and writes its dump there as
``rank_<N>`` (the name torch's analyzer reads a rank from). The dump is taken in process, on the shipper
thread: it copies the recorder's buffer under the recorder's own lock and never waits on the backend or
on the training thread, and leaves the records' stack traces out (symbolizing them takes the GIL, and can
take seconds).

gloo's recorder leaves the dump's group table (``pg_config``) without names (torch 2.11-2.15), which
stops torch's analyzer (``KeyError`` on the first group); the table is filled from c10d's registry here,
each group's name, description and global ranks, before the dump is written.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

FLIGHT_ENV = "MESHTOP_FLIGHT_DIR"
"""The folder of a job's flight-recorder requests and dumps (set by the launcher on every rank)."""
FLIGHT_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
FLIGHT_BUFFER = 2000
"""Entries each rank's recorder keeps: the last 2000 collectives (torch's default, 0, is off)."""
REQUEST_NAME = "request"


def dump_path(folder: Path, rank: int) -> Path:
    return folder / f"rank_{rank}"


def group_table() -> dict[str, dict[str, str]]:
    """Every process group c10d knows, as the flight recorder's ``pg_config`` lists them."""
    import torch.distributed as dist  # only in a rank: the launcher and the planner never load torch for this

    world = dist.distributed_c10d._world
    table: dict[str, dict[str, str]] = {}
    for group, name in list(world.pg_names.items()):
        try:
            ranks = sorted(dist.get_process_group_ranks(group))
        except (RuntimeError, ValueError, KeyError):  # torn down while this ran
            continue
        table[name] = {"name": name, "desc": getattr(group, "group_desc", name), "ranks": str(ranks)}
    return table


def completed(raw: bytes) -> bytes:
    """A pickled dump with its group table filled in where the backend left it unnamed."""
    dump: dict[str, Any] = pickle.loads(raw)  # torch's own dump, made in this process a moment ago
    named = {key: value for key, value in dump.get("pg_config", {}).items() if key}
    dump["pg_config"] = {**group_table(), **named}
    return pickle.dumps(dump)


class FlightDumps:
    """A rank's side: at each :meth:`poll` (the shipper's, four a second), a new request is answered with a
    dump. Any failure is one line for ``on_error``; the rank goes on."""

    def __init__(self, rank: int, folder: Path | None, on_error: Any = None) -> None:
        self.rank = rank
        self.folder = folder
        self.on_error = on_error
        self._answered: str | None = None

    @classmethod
    def from_environment(cls, rank: int, on_error: Any = None) -> FlightDumps:
        folder = os.environ.get(FLIGHT_ENV)
        return cls(rank, Path(folder) if folder else None, on_error)

    def poll(self) -> None:
        if self.folder is None:
            return
        try:
            request = (self.folder / REQUEST_NAME).read_text()
        except OSError:  # none asked yet
            return
        if request == self._answered:
            return
        self._answered = request
        try:
            self.dump()
        except Exception as error:  # a probe must never stop the rank
            if self.on_error is not None:
                self.on_error(f"flight recorder dump: {type(error).__name__}: {error}")

    def dump(self) -> None:
        from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]  # not in torch's stubs

        assert self.folder is not None
        target = dump_path(self.folder, self.rank)
        partial = self.folder / f".writing-{self.rank}"  # no "rank_" in its name: the analyzer skips it
        partial.write_bytes(completed(_dump_fr_trace(True, False)))
        partial.replace(target)  # whole or absent: the launcher reads it as soon as it is there
