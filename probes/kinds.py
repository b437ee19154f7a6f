"""What meshtop does with each kind of event (:mod:`meshtop.probes.events`), declared once a kind: the table every
module that routes kinds reads, in the fold's order."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from meshtop.probes.events import EVENT_TYPES


@dataclass(frozen=True, slots=True)
class KindRole:
    """What meshtop does with one kind of event, besides writing it to the recording (every kind is written)."""

    bulk: bool
    """Tens a rank a step (collectives, stage actions): decoded a column at a time, and the part of a batch a live
    view leaves out, counted and said, when it cannot keep up."""
    folded: bool
    """It changes a figure of the metrics core (:class:`meshtop.recordings.metrics.run.RunFold`), or a rank's
    place in its lifecycle, which the core follows (started, where; exited, how)."""
    shown: bool
    """The live dashboard reads it; a live screen decodes no other kind."""
    progress: bool
    """Steps, requests and the world size come from it: all that ``record``'s console and the manifest need
    while the job runs."""
    printed: bool
    """``record`` prints it as a notice (the dashboard shows the same notices in its Alerts)."""
    coalescible: bool
    """A newer event of the kind follows soon and says as much (an operation of a rank's next step, a sampler's
    next reading): a live screen that falls behind may skip it (the recording and the session's fold keep it).
    A start, an exit, a step, a request or a memory snapshot is never skipped: a lost start would leave a rank
    on the wrong stage, a lost step a hole in every figure."""
    forwarded: bool
    """A node forwards it to the head. A node's own view of how its ranks ended is not: its ``bye`` carries
    that, and the head records the job's."""
    described: bool
    """The manifest says what it tells (a rank's place, the GPUs and their links, a node's clock): the recorder
    decodes it as events, few as they are (the GPU samples it reads as a table)."""
    section: int
    """Where it goes in one rank's message: 0 first (a rank's place comes before its work), 2 last (a step or
    a request closes what the rank sent before it), 1 between."""


# fmt: off
_ROLES: tuple[tuple[str, str], ...] = (
    # The order is the fold's within one slice of time: a rank's start before its work, a step after the work
    # it closes, the job's end last. Flags: b bulk, f folded, s shown, p progress, n printed (notice),
    # c coalescible, w forwarded, m described in the manifest; the digit is the section.
    ("rank_started",    "  f s p     w m 0"),
    ("nvml_state",      "    s       w m 1"),
    ("gpu_link",        "            w m 1"),
    ("probe_off",       "    s   n   w   1"),
    ("collective",      "b f s     c w   1"),
    ("stage_action",    "b f s     c w   1"),
    ("memory",          "  f s       w   1"),
    ("process",         "  f s     c w   1"),
    ("gpu",             "  f s     c w   1"),
    ("server_state",    "    s   n   w   1"),
    ("server_metric",   "  f s       w   1"),
    ("request",         "  f s p     w   2"),
    ("rank_progress",   "            w   1"),
    ("step",            "  f s p     w   2"),
    ("sampler_error",   "    s       w   1"),
    ("events_dropped",  "    s   n   w   1"),
    ("frames_refused",  "    s   n   w   1"),
    ("stack_dump",      "    s   n   w   1"),
    ("hang",            "    s   n   w   1"),
    ("flight_verdict",  "    s   n   w   1"),
    ("rank_exited",     "  f s           1"),
    ("job_ended",       "  f s p         1"),
    ("node_clock",      "            w m 1"),
)
# fmt: on


def _role(flags: str) -> KindRole:
    words = flags.split()
    return KindRole(
        bulk="b" in words,
        folded="f" in words,
        shown="s" in words,
        progress="p" in words,
        printed="n" in words,
        coalescible="c" in words,
        forwarded="w" in words,
        described="m" in words,
        section=int(words[-1]),
    )


KINDS: MappingProxyType[str, KindRole] = MappingProxyType({kind: _role(flags) for kind, flags in _ROLES})
"""Every kind of event and what meshtop does with it, in the fold's order: the one place a kind's routing is
declared; every module that treats kinds differently reads it (through the sets below)."""
assert KINDS.keys() == EVENT_TYPES.keys(), "a kind of EVENT_TYPES missing from KINDS, or one too many"

FOLD_ORDER = {kind: index for index, kind in enumerate(KINDS)}
"""A kind's place in the fold's order (:data:`KINDS`)."""
BULK_KINDS = frozenset(kind for kind, role in KINDS.items() if role.bulk)
FOLDED_KINDS = frozenset(kind for kind, role in KINDS.items() if role.folded)
SHOWN_KINDS = frozenset(kind for kind, role in KINDS.items() if role.shown)
PROGRESS_KINDS = frozenset(kind for kind, role in KINDS.items() if role.progress)
PRINTED_KINDS = frozenset(kind for kind, role in KINDS.items() if role.printed)
COALESCIBLE_KINDS = frozenset(kind for kind, role in KINDS.items() if role.coalescible)
FORWARDED_KINDS = frozenset(kind for kind, role in KINDS.items() if role.forwarded)
DESCRIBED_KINDS = frozenset(kind for kind, role in KINDS.items() if role.described)
