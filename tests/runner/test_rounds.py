"""torchrun's restarts at the head: a later start's steps are numbered on after the earlier ones', and the
figures count each start's ranks (:mod:`meshtop.runner.job.rounds`)."""

from __future__ import annotations

from meshtop.probes.arrivals import Arrivals, EncodedEvents, decode_lines, encode_lines
from meshtop.probes.events import Event
from meshtop.recordings.metrics.run import RunFold
from meshtop.runner.job.rounds import Rounds
from tests.kit.events import collective, rank_started, step
from tests.kit.recordings import elastic_script


def block(events: list[Event], rank: int = 0) -> EncodedEvents:
    """As a worker (one rank) or another node's relay (many ranks, ``rank`` 0) sends them."""
    return EncodedEvents(events[0].kind, rank, encode_lines(events), len(events))


def recorded(arrivals: Arrivals, kind: str) -> list[Event]:
    """What the recording gets: the blocks' lines as they now are."""
    return [
        event
        for item in arrivals.items
        if item.kind == kind
        for event in (decode_lines(item.lines, kind)[0] if isinstance(item, EncodedEvents) else [item])
    ]


def test_a_restarts_steps_follow_the_earlier_starts_and_each_start_counts_its_ranks() -> None:
    rounds, fold = Rounds(), RunFold(elastic_script(4))
    first = Arrivals(
        [
            block([rank_started(0, world_size=2)], 0),
            block([rank_started(1, world_size=2)], 1),
            *(block([step(rank, n) for n in range(3)], rank) for rank in (0, 1)),
            block([collective(0, 2)], 0),
        ]
    )
    began = rounds.admit(first)
    assert [(s.restart, s.first_step, s.world_size) for s in began] == [(0, 0, 2)]
    assert [e.step for e in recorded(first, "step")] == [0, 1, 2, 0, 1, 2]  # the first start: untouched
    fold.apply_events(first.events())

    # node 1 joined: torchrun starts all four ranks again; its events come through its relay, many ranks a block
    again = Arrivals(
        [
            block([rank_started(0, world_size=4, restart=1), rank_started(1, world_size=4, restart=1)], 0),
            block([rank_started(2, world_size=4, restart=1), rank_started(3, world_size=4, restart=1)]),
            block([step(r, n) for r in (0, 1) for n in range(2)], 0),
            block([step(r, n) for r in (2, 3) for n in range(2)]),
            block([collective(2, 0), collective(3, None)]),
        ]
    )
    began = rounds.admit(again)
    assert [(s.restart, s.first_step, s.world_size) for s in began] == [(1, 3, 4)]
    assert {e.first_step for e in recorded(again, "rank_started")} == {3}  # type: ignore[attr-defined]
    assert sorted({e.step for e in recorded(again, "step")}) == [3, 4]
    assert [e.step for e in recorded(again, "collective")] == [3, None]  # type: ignore[attr-defined]
    assert [e.step for e in again.events(("step",))] == [e.step for e in recorded(again, "step")]  # type: ignore[attr-defined]
    fold.apply_events(again.events())
    fold.finish("completed")
    assert fold.steps.count == 5 and fold.run.world_size == 4  # 3 steps of 2 ranks, then 2 of 4
