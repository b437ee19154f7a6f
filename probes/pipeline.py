"""Time pipeline stages: compute per microbatch, and blocking on pipeline P2P.

``torch.distributed.pipelining`` runs every stage action through three
methods of ``_PipelineStageBase`` (forward, backward, backward-weight of one
microbatch) and blocks on P2P only in ``schedules._wait_batch_p2p``. The probe
wraps those four places for the life of the worker. Each stage action is an
event; the waits, many and short, are summed per step
(:meth:`StageProbe.take_wait_s`) rather than sent one by one.

All four are private to torch: :meth:`StageProbe.install` checks that each is
there before it patches any (:func:`meshtop.probes.patching.require`), so a release
that renamed one leaves the probe off, and the worker reports why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from meshtop.probes.events import Event, StageAction
from meshtop.probes.patching import Patches, require

STAGE_METHODS = {
    "forward_one_chunk": "forward",
    "backward_one_chunk": "backward",
    "backward_weight_one_chunk": "backward_weight",
}


class StageProbe:
    """Emits a :class:`StageAction` for every stage action of this rank and sums its P2P waits."""

    def __init__(
        self,
        *,
        rank: int,
        emit: Callable[[Event], None],
        step: Callable[[], int | None],
        on_stage: Callable[[tuple[int, ...]], None] | None = None,
    ) -> None:
        self.rank = rank
        self.emit = emit
        self.step = step
        self.on_stage = on_stage
        """Called with this rank's stages (sorted) each time it runs a stage it had not run before."""
        self._stages: set[int] = set()
        self._patches = Patches()
        self._wait_ns = 0

    def take_wait_s(self) -> float:
        """Seconds blocked on pipeline P2P since the last call."""
        wait_ns, self._wait_ns = self._wait_ns, 0
        return wait_ns / 1e9

    def install(self) -> None:
        """Wrap the stage actions and the P2P wait; :class:`~meshtop.probes.patching.MissingInternal` before any
        patch where this torch lacks one of them. Imports pipelining here, not before: it costs about 0.9 s,
        which a user's script that does not pipeline should not pay (:mod:`meshtop.runner.script.attach`)."""
        from torch.distributed.pipelining import schedules, stage

        stage_base = require(stage, "_PipelineStageBase")
        originals = {method: require(stage_base, method) for method in STAGE_METHODS}
        wait_batch_p2p = require(schedules, "_wait_batch_p2p")
        for method, action in STAGE_METHODS.items():
            self._patches.replace(stage_base, method, self._timed_stage(originals[method], action))
        self._patches.replace(schedules, "_wait_batch_p2p", self._timed_wait(wait_batch_p2p))

    def uninstall(self) -> None:
        self._patches.restore()

    def _timed_stage(self, original: Callable[..., Any], action: str) -> Callable[..., Any]:
        probe = self

        def timed(stage_self: Any, chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            if probe.on_stage is not None and stage_self.stage_index not in probe._stages:
                probe._stages.add(stage_self.stage_index)
                probe.on_stage(tuple(sorted(probe._stages)))
            start_ns = time.time_ns()
            try:
                return original(stage_self, chunk_id, *args, **kwargs)
            finally:
                probe.emit(
                    StageAction(
                        rank=probe.rank,
                        step=probe.step(),
                        stage=stage_self.stage_index,
                        microbatch=chunk_id,
                        action=action,
                        start_ns=start_ns,
                        end_ns=time.time_ns(),
                    )
                )

        return timed

    def _timed_wait(self, original: Callable[..., Any]) -> Callable[..., Any]:
        probe = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            start_ns = time.perf_counter_ns()
            try:
                return original(*args, **kwargs)
            finally:
                probe._wait_ns += time.perf_counter_ns() - start_ns

        return timed
