"""What a run's fold gives: every figure of the run at one moment, and its JSON (``summary --json``, the
manifest's figures). :class:`~meshtop.recordings.metrics.run.RunFold` computes it; each figure's rule lives in
its family's module."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from meshtop.recordings.metrics.breakdown import Breakdown
from meshtop.recordings.metrics.collectives import CollectiveRow
from meshtop.recordings.metrics.gpus import GpuRow
from meshtop.recordings.metrics.memory import MemoryRow
from meshtop.recordings.metrics.mfu import Mfu
from meshtop.recordings.metrics.pipeline import StageRow
from meshtop.recordings.metrics.requests import RequestFigures
from meshtop.recordings.metrics.server import ServerFigures
from meshtop.recordings.metrics.steps import StepFigures
from meshtop.recordings.metrics.stragglers import Straggler


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFigures:
    """Every figure of a run at one moment."""

    steps: StepFigures
    collectives: tuple[CollectiveRow, ...]
    stages: tuple[StageRow, ...]
    memory: tuple[MemoryRow, ...]
    most_loaded_rank: int | None
    headroom_bytes: int | None
    """Device memory left on the most loaded rank's GPU at its peak (CUDA only)."""
    requests: RequestFigures | None
    """``None`` for training."""
    mfu: Mfu
    stragglers: tuple[Straggler, ...]
    """Ranks named stragglers now: slower than their stage peers beyond chance, for long enough (training)."""
    server: ServerFigures | None = None
    """An endpoint's engine, from its scraped ``/metrics`` (``None`` without them)."""
    gpus: tuple[GpuRow, ...] = ()
    """Each GPU sampled (NVML): its peak memory used and mean utilisation."""
    breakdown: Breakdown | None = None
    """Where the steps went, per part (training ranks that measured their phases; ``None`` where none did)."""

    def to_json(self) -> dict[str, object]:
        return {
            "steps": self.steps.to_json(),
            "mfu": asdict(self.mfu),
            "requests": self.requests.to_json() if self.requests is not None else None,
            "collectives": [row.to_json() for row in self.collectives],
            "stages": [asdict(row) for row in self.stages],
            "memory": [asdict(row) for row in self.memory],
            "most_loaded_rank": self.most_loaded_rank,
            "headroom_bytes": self.headroom_bytes,
            "stragglers": [straggler_json(straggler) for straggler in self.stragglers],
            "server": self.server.to_json() if self.server is not None else None,
            "gpus": [asdict(row) for row in self.gpus],
            "breakdown": self._breakdown_json(),
        }

    def _breakdown_json(self) -> dict[str, object] | None:
        """The breakdown, and the straggler it explains (the one furthest from its peers; ``None`` without)."""
        if self.breakdown is None:
            return None
        explained = [straggler for straggler in self.stragglers if straggler.cause is not None]
        worst = max(explained, key=lambda straggler: straggler.ratio, default=None)
        return {**self.breakdown.to_json(), "straggler": straggler_json(worst) if worst is not None else None}


def straggler_json(straggler: Straggler) -> dict[str, object]:
    return {**asdict(straggler), "verdict": straggler.verdict}
