"""A worker's message built in one call, as its shipper sends it, for tests and benchmarks that play a rank
(imports only the probes' wire: a rank stays free of pandas and pyarrow)."""

from __future__ import annotations

from collections.abc import Iterable

from meshtop.probes.arrivals import EncodedEvents
from meshtop.probes.events import Event
from meshtop.probes.wire import event_sections, pack


def encode_events(
    *, token: str, rank: int, dropped: int, events: Iterable[Event], blocks: Iterable[EncodedEvents] = ()
) -> bytes:
    """The frame of ``events`` and the encoded ``blocks`` in :func:`meshtop.probes.wire.event_sections`, its
    header as :mod:`meshtop.probes.sender` writes it (the token, the rank, the events dropped)."""
    listed, body = event_sections(events, blocks)
    return pack({"token": token, "rank": rank, "dropped": dropped, "sections": listed}, body)
