"""torchrun's restarts at the head: a later start's steps are numbered on after the earlier ones', and the
figures count each start's ranks (:mod:`meshtop.runner.job.rounds`)."""

from __future__ import annotations

from meshtop.probes.arrivals import Arrivals, EncodedEvents, decode_lines, encode_lines
from meshtop.probes.events import Event
from meshtop.recordings.metrics.run import RunFold
from meshtop.runner.job.rounds import Rounds
from tests.kit.events import collective, fold_events, memory_snapshot, rank_progress, rank_started, stage_action, step
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


def steps_recorded(arrivals: Arrivals, kind: str) -> list[int | None]:
    """The steps the recording gets for ``kind``'s events (a kind that names one)."""
    return [event.step for event in recorded(arrivals, kind)]  # type: ignore[attr-defined]


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
    fold_events(fold, first.events())

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
    assert [e.step for e in again.events(("step",))] == [e.step for e in recorded(again, "step")]
    fold_events(fold, again.events())
    fold.finish("completed")
    assert fold.steps.count == 5 and fold.run.world_size == 4  # 3 steps of 2 ranks, then 2 of 4


def test_a_restarts_memory_snapshots_stage_actions_and_heartbeats_are_renumbered_as_its_steps_are() -> None:
    """Every kind that names a step follows the round's base, from a rank's own block, a relay's block of many
    ranks or an event made here; a step not said stays unsaid. A memory snapshot left at the rank's own step
    would lose to the earlier start's later one: the figures would show the first start's memory."""
    rounds, fold = Rounds(), RunFold(elastic_script(4))
    first = Arrivals(
        [
            block([rank_started(0, world_size=2)], 0),
            block([rank_started(1, world_size=2)], 1),
            *(block([step(rank, n) for n in range(3)], rank) for rank in (0, 1)),
            *(block([memory_snapshot(rank, 100, step=n, wall_ns=n + 1) for n in range(3)], rank) for rank in (0, 1)),
            block([stage_action(0, 2), stage_action(1, 2, "backward", stage=1)], 0),
            block([rank_progress(1, 2)], 1),
        ]
    )
    rounds.admit(first)
    assert steps_recorded(first, "memory") == [0, 1, 2, 0, 1, 2]  # the first start: untouched
    assert steps_recorded(first, "stage_action") == [2, 2]
    assert steps_recorded(first, "rank_progress") == [2]
    fold_events(fold, first.events())

    again = Arrivals(
        [
            block([rank_started(0, world_size=4, restart=1), rank_started(1, world_size=4, restart=1)], 0),
            block([rank_started(2, world_size=4, restart=1), rank_started(3, world_size=4, restart=1)]),
            block([step(r, n) for r in (0, 1) for n in range(2)], 0),
            block([step(r, n) for r in (2, 3) for n in range(2)]),
            block([memory_snapshot(0, 50, step=n, wall_ns=10 + n) for n in range(2)], 0),
            block([memory_snapshot(r, 50, step=n, wall_ns=10 + n) for r in (1, 2, 3) for n in range(2)]),
            block([stage_action(0, 0), stage_action(0, 1, "backward")], 0),
            block([stage_action(r, n, stage=1) for r in (2, 3) for n in (0, None)]),
            block([rank_progress(0, 1)], 0),
            block([rank_progress(2, 0), rank_progress(3, None)]),
        ]
    )
    again.add([memory_snapshot(1, 50, step=1, wall_ns=20), stage_action(1, 0, stage=1), rank_progress(1, 1)])
    rounds.admit(again)
    assert steps_recorded(again, "memory") == [3, 4, 3, 4, 3, 4, 3, 4, 4]
    assert steps_recorded(again, "stage_action") == [3, 4, 3, None, 3, None, 3]
    assert steps_recorded(again, "rank_progress") == [4, 3, None, 4]
    fold_events(fold, again.events())
    fold.finish("completed")
    assert [(row.rank, row.weights_bytes) for row in fold.figures().memory] == [(r, 50) for r in range(4)]
