"""Keep a session: write every event into its recording as it arrives, fold it into the session's one fold,
and close the recording with how the session ended (compact tables, final manifest).

The workers' events go to disk as they came; the session's fold
(:class:`meshtop.recordings.session_fold.SessionFold`) decodes what changes a
figure, and gives the manifest its step count and the run as its ranks
described it; of the rest the recorder decodes only what the manifest holds
(rank starts, NVML, the GPUs, their links, the nodes' clocks).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.events import GpuLink, NodeClock, NvmlState, RankStarted
from meshtop.probes.kinds import DESCRIBED_KINDS
from meshtop.recordings.events_log import EventWriter
from meshtop.recordings.manifest import (
    GpuInfo,
    Manifest,
    NodeInfo,
    RankExit,
    RunDescription,
    release_room,
    write_manifest,
)
from meshtop.recordings.metrics.gpus import first_sample_of_each_gpu
from meshtop.recordings.session_fold import Folded, SessionFold, arrival_tables
from meshtop.recordings.tables import compact


@dataclass(frozen=True, slots=True, kw_only=True)
class Ending:
    """How a session ended, for its manifest."""

    status: str
    """completed, failed or interrupted."""
    duration_s: float | None
    ranks: tuple[RankExit, ...] = ()
    root_cause_rank: int | None = None
    hang: str | None = None
    reason: str | None = None
    """Why the session itself broke, where it did."""
    run: RunDescription | None = None
    """The run as it turned out, where it said more than at its start (a server meshtop started: its model
    and how it ran)."""


class SessionRecorder:
    """Writes a session's events into its recording (when there is a manifest) and folds them into the
    session's fold."""

    def __init__(self, session: SessionFold, directory: Path, manifest: Manifest | None) -> None:
        self.session = session
        self.directory = directory
        self.manifest = manifest
        self.writer = EventWriter(directory) if manifest is not None else None
        self.run = session.run
        """The run as the manifest on disk describes it."""
        self._devices: dict[int, str] = {}
        self._nvml: NvmlState | None = None
        self._gpus: dict[tuple[int, int], GpuInfo] = {}
        self._hosts: dict[int, str] = {}
        self._node_ranks: dict[int, dict[int, set[int]]] = {}
        """Each node's ranks, by torchrun's restart count of their start (the nodes hold the latest's)."""
        self._clocks: dict[int, NodeClock] = {}
        self._topology: list[GpuLink] = []

    @property
    def steps_completed(self) -> int:
        """Job steps completed (inference: rank 0's iterations), as the session's fold counts them."""
        return self.session.steps_completed

    def take(self, arrivals: Arrivals) -> Folded:
        """Record ``arrivals`` (on disk first), then :meth:`fold` them; what the fold took of them."""
        self.write(arrivals)
        return self.fold(arrivals)

    def write(self, arrivals: Arrivals) -> None:
        """Record ``arrivals`` on disk, as they came."""
        if self.writer is not None:
            self.writer.write(arrivals.items)

    def fold(self, arrivals: Arrivals, *, bulk_left_out: bool = False) -> Folded:
        """Fold recorded ``arrivals`` into the session's fold and keep what the manifest says of them; what the
        fold took of them (``bulk_left_out``: :meth:`SessionFold.take`'s)."""
        folded = self.session.take(arrivals, bulk_left_out=bulk_left_out)
        self._follow_run()
        gpus = [table for kind, table in folded.tables if kind == "gpu"]
        if not gpus and arrivals.has("gpu"):  # a headless session's fold does not read them
            gpus = [table for _, table in arrival_tables(arrivals, {"gpu"})]
        for table in gpus:
            self._note_gpus(table)
        for event in arrivals.events(DESCRIBED_KINDS):
            if isinstance(event, RankStarted):
                self._devices[event.rank] = event.device
                self._hosts.setdefault(event.node, event.host)
                self._node_ranks.setdefault(event.restart, {}).setdefault(event.node, set()).add(event.rank)
            elif isinstance(event, NvmlState):
                self._nvml = event
            elif isinstance(event, GpuLink):
                self._topology.append(event)
            elif isinstance(event, NodeClock):
                self._clocks[event.node] = event
        return folded

    def _note_gpus(self, table: pa.Table) -> None:
        """Each GPU the samples name, as first sampled: its name, memory and power limit (read from the
        table, where one event object a sample cost the head 25 us a sample on many nodes)."""
        first = first_sample_of_each_gpu(table, ["name", "memory_total_bytes", "power_limit_w"])
        for (node, gpu), (name, total, limit) in first.items():
            if (node, gpu) not in self._gpus:
                self._gpus[(node, gpu)] = GpuInfo(
                    gpu=gpu, name=name, memory_total_bytes=total, node=node, power_limit_w=limit
                )

    def _follow_run(self) -> None:
        """The ranks said how many they are (an elastic script's were counted for MAX nodes, a restart's may be
        another number): the fold follows, and the manifest on disk says so at once."""
        run = self.session.run
        if run is self.run:
            return
        self.run = run
        if self.manifest is not None:
            self.manifest = dataclasses.replace(self.manifest, run=run)
            try:
                write_manifest(self.directory, self.manifest)
            except OSError:  # the final manifest says it, if it can be written
                pass

    def nodes(self) -> tuple[NodeInfo, ...]:
        """Every node that reported: its host, ranks and GPUs, and its clock against the head's."""
        found = sorted(set(self._hosts) | set(self._clocks) | {node for node, _ in self._gpus})
        latest = self._node_ranks[max(self._node_ranks)] if self._node_ranks else {}  # the last start's ranks
        return tuple(
            NodeInfo(
                node=node,
                host=self._hosts.get(node) or (self._clocks[node].host if node in self._clocks else None),
                ranks=tuple(sorted(latest.get(node, ()))),
                gpus=tuple(sorted(gpu for owner, gpu in self._gpus if owner == node)),
                # a node measures its clock before it forwards anything: one without a measurement is the head
                clock_offset_ns=self._clocks[node].offset_ns if node in self._clocks else 0,
                clock_rtt_ns=self._clocks[node].rtt_ns if node in self._clocks else 0,
            )
            for node in found
        )

    def close(self, ending: Ending) -> str | None:
        """Write the final manifest, into the room kept for it, then compact the tables; why the manifest
        could not be written (the folder turned read-only: it still says ``running``), if it could not."""
        if self.writer is None or self.manifest is None:
            return None
        self.writer.close()
        release_room(self.directory)
        self.manifest = dataclasses.replace(
            self.manifest,
            run=ending.run or self.manifest.run,
            status=ending.status,
            ended_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            duration_s=round(ending.duration_s, 3) if ending.duration_s is not None else None,
            steps_completed=self.steps_completed,
            ranks=ending.ranks,
            root_cause_rank=ending.root_cause_rank,
            hang=ending.hang,
            reason=ending.reason,
            rank_devices={str(rank): device for rank, device in sorted(self._devices.items())},
            nvml=self._nvml,
            gpus=tuple(self._gpus[gpu] for gpu in sorted(self._gpus)),
            topology=tuple(self._topology),
            nodes=self.nodes(),
        )
        unwritten = None
        try:
            write_manifest(self.directory, self.manifest)
        except OSError as error:  # the folder is gone or read-only: the manifest stays "running"
            unwritten = error.strerror or str(error)
        try:
            compact(self.directory)
        except OSError:  # no room for the Parquet copy, or the folder is gone: the JSON lines stay, readable
            pass
        return unwritten
