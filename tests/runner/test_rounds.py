"""torchrun's restarts at the head: a later start's steps are numbered on after the earlier ones', and the
figures count each start's ranks (:mod:`meshtop.runner.job.rounds`)."""

from __future__ import annotations

from meshtop.probes.arrivals import Arrivals, EncodedEvents, decode_lines, encode_lines
from meshtop.probes.events import CollectiveTiming, Event, RankStarted, StepTiming
from meshtop.recordings.metrics.run import RunFold
from meshtop.runner.job.rounds import Rounds
from tests.runner.test_nodes import elastic_script


def start(rank: int, world_size: int, restart: int) -> RankStarted:
    return RankStarted(
        rank=rank,
        pid=100 * restart + rank,
        host="a",
        device="cpu",
        pp_rank=0,
        dp_rank=rank,
        tp_rank=0,
        stages=(),
        local_parameters=10,
        wall_ns=1,
        world_size=world_size,
        restart=restart,
    )


def step(rank: int, number: int) -> StepTiming:
    return StepTiming(rank=rank, step=number, start_ns=10**9 * (number + 1), duration_s=0.1, loss=1.0, tokens=8)


def collective(rank: int, number: int | None) -> CollectiveTiming:
    at = 10**9 * ((number or 0) + 1)
    return CollectiveTiming(
        rank=rank,
        step=number,
        op="all_reduce",
        group="dp",
        group_size=2,
        peer=None,
        bytes=8,
        dtype="float32",
        start_ns=at,
        end_ns=at + 5,
        clock="completion",
    )


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
            block([start(0, 2, 0)], 0),
            block([start(1, 2, 0)], 1),
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
            block([start(0, 4, 1), start(1, 4, 1)], 0),
            block([start(2, 4, 1), start(3, 4, 1)]),
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
