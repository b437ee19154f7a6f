"""torchrun's restarts: one job, several starts of its ranks, one sequence of steps.

torchrun starts every rank again after a failure (``--max-restarts N``) and
when an elastic job's nodes change (``--nnodes MIN:MAX``: a node that comes
after the start joins at the next one). Each start is a round: its ranks say
so in their :class:`RankStarted` (torchrun's restart count, and their world
size, which may differ from the round before), and their step counters begin
at 0 again.

The head numbers a later round's steps on after the earlier rounds', so a
recording's steps stay one sequence, every figure folds them as usual, and
nothing of an earlier round is overwritten::

    recorded step = base(r) + the rank's own step,
    base(r) = 1 + the highest step recorded when round r's first rank started (base(0) = 0)

Every event of a rank in round r that names a step is renumbered so, and the
round's :class:`RankStarted` carries ``base(r)`` as its ``first_step``, which
tells a fold how many ranks each step waits for. Events of the earlier round
still in flight when the new one starts are not told apart: torchrun stops
every rank of a round before it starts the next.
"""

from __future__ import annotations

import dataclasses

from meshtop.probes.arrivals import Arrivals, EncodedEvents, encode_lines
from meshtop.probes.events import EVENT_TYPES, Event, RankStarted, StepTiming

STEPPED = frozenset(kind for kind, cls in EVENT_TYPES.items() if "step" in {f.name for f in dataclasses.fields(cls)})
"""Kinds whose events name a step (a field ``step``): their steps are renumbered."""


class Rounds:
    """The head's view of the job's starts; :meth:`admit` renumbers what arrives, in place."""

    def __init__(self) -> None:
        self.restart = 0
        """The latest round's restart count."""
        self._bases: dict[int, int] = {}
        """Each round's base, by restart count."""
        self._round_of: dict[int, int] = {}
        """Each rank's round, from its last start."""
        self._last_step = -1

    def admit(self, arrivals: Arrivals) -> list[RankStarted]:
        """Renumber the steps of ranks in a later round, in arrival order (a rank's start comes before its
        steps); the first start of each round that began here (the first round's too)."""
        began = []
        for index, item in enumerate(arrivals.items):
            if item.kind == "rank_started":
                began += self._starts(arrivals, index)
            elif item.kind in STEPPED:
                if any(self._bases.values()):
                    self._renumber(arrivals, index)
                if item.kind == "step":
                    self._last_step = max(
                        [
                            self._last_step,
                            *(event.step for event in _events(arrivals, index) if isinstance(event, StepTiming)),
                        ]
                    )
        return began

    def _starts(self, arrivals: Arrivals, index: int) -> list[RankStarted]:
        events = _events(arrivals, index)
        began: list[RankStarted] = []
        stamped: list[RankStarted] = []
        for event in events:
            assert isinstance(event, RankStarted)
            latest = event.restart >= self.restart
            new = event.restart not in self._bases
            if new:  # a round older than the latest, seen first now, cannot be placed: it counts from 0
                self._bases[event.restart] = self._last_step + 1 if latest else 0
            self._round_of[event.rank] = event.restart
            stamped.append(dataclasses.replace(event, first_step=self._bases[event.restart]))
            if new and latest:
                self.restart = event.restart
                began.append(stamped[-1])
        if any(event.first_step for event in stamped):
            _put(arrivals, index, [*stamped])
        return began

    def _renumber(self, arrivals: Arrivals, index: int) -> None:
        """Each event by its own rank's round (a block another node forwarded holds many ranks)."""
        events = _events(arrivals, index)
        renumbered = [
            dataclasses.replace(event, step=event.step + base)  # type: ignore[attr-defined, call-arg]
            if (base := self._base_of(event))
            else event
            for event in events
        ]
        if any(new is not old for new, old in zip(renumbered, events, strict=False)):
            _put(arrivals, index, renumbered)

    def _base_of(self, event: Event) -> int:
        rank, step = getattr(event, "rank", None), getattr(event, "step", None)
        if not isinstance(rank, int) or not isinstance(step, int):
            return 0
        return self._bases.get(self._round_of.get(rank, 0), 0)


def _events(arrivals: Arrivals, index: int) -> list[Event]:
    item = arrivals.items[index]
    return item.events() if isinstance(item, EncodedEvents) else [item]


def _put(arrivals: Arrivals, index: int, events: list[Event]) -> None:
    """Replace the item at ``index`` by ``events`` (a block stays one block, already decoded, and on this
    machine's clock: another node's was moved as it was decoded)."""
    item = arrivals.items[index]
    if isinstance(item, EncodedEvents):
        arrivals.items[index] = EncodedEvents(
            kind=item.kind, rank=item.rank, lines=encode_lines(events), count=len(events), bad=item.bad, _events=events
        )
    else:
        arrivals.items[index] = events[0]
