"""The kinds table read by hand: each kind's flags say its role, and the sets every router reads are the kinds
the table marks (worked out from its rows, not from the sets' own code)."""

from __future__ import annotations

from meshtop.probes.kinds import (
    BULK_KINDS,
    COALESCIBLE_KINDS,
    DESCRIBED_KINDS,
    FOLD_ORDER,
    FOLDED_KINDS,
    FORWARDED_KINDS,
    KINDS,
    PRINTED_KINDS,
    PROGRESS_KINDS,
    SHOWN_KINDS,
    KindRole,
    _role,
)


def role(*, section: int, **flags: bool) -> KindRole:
    """A role with the flags named true, the others false."""
    names = ("bulk", "folded", "shown", "progress", "printed", "coalescible", "forwarded", "described")
    return KindRole(**{name: flags.get(name, False) for name in names}, section=section)


def test_each_letter_of_a_kinds_flags_sets_its_own_role_and_the_digit_its_section() -> None:
    assert _role("b f s c w 1") == role(bulk=True, folded=True, shown=True, coalescible=True, forwarded=True, section=1)
    assert _role("f s p w 0") == role(folded=True, shown=True, progress=True, forwarded=True, section=0)
    assert _role("  s n w 1") == role(shown=True, printed=True, forwarded=True, section=1)
    assert _role("f s p w 2") == role(folded=True, shown=True, progress=True, forwarded=True, section=2)
    assert _role("f s p   1") == role(folded=True, shown=True, progress=True, section=1)
    assert _role("      w 1") == role(forwarded=True, section=1)
    assert _role("      w m 1") == role(forwarded=True, described=True, section=1)


def test_the_table_gives_each_kind_its_role_and_each_set_its_kinds() -> None:
    assert KINDS["collective"] == role(bulk=True, folded=True, shown=True, coalescible=True, forwarded=True, section=1)
    assert KINDS["step"] == role(folded=True, shown=True, progress=True, forwarded=True, section=2)
    assert KINDS["rank_exited"] == role(folded=True, shown=True, section=1)
    assert {"collective", "stage_action"} == BULK_KINDS
    assert {"rank_started", "request", "step", "job_ended"} == PROGRESS_KINDS
    assert {
        "probe_off",
        "server_state",
        "events_dropped",
        "frames_refused",
        "stack_dump",
        "hang",
        "flight_verdict",
    } == PRINTED_KINDS
    assert {"collective", "stage_action", "process", "gpu"} == COALESCIBLE_KINDS
    assert {
        "rank_started",
        "collective",
        "stage_action",
        "memory",
        "process",
        "gpu",
        "server_metric",
        "request",
        "step",
        "rank_exited",
        "job_ended",
    } == FOLDED_KINDS
    assert set(KINDS) - SHOWN_KINDS == {"gpu_link", "rank_progress", "node_clock"}
    assert set(KINDS) - FORWARDED_KINDS == {"rank_exited", "job_ended"}
    assert {"rank_started", "nvml_state", "gpu_link", "node_clock"} == DESCRIBED_KINDS
    assert (FOLD_ORDER["rank_started"], FOLD_ORDER["step"], FOLD_ORDER["job_ended"]) == (0, 13, 21)
