"""The C++ and the Python collective kernels report the same operations the same way (what each is, how
long it was waited for, whether it overlapped another on its group), and the C++ one is found, built and
loaded as the launcher arranges (or its absence said in one line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshtop.probes import native
from meshtop.probes.errors import ProbeError
from tests.kernel_worker import LATE_S, NAMING_STEPS, ODD_NAMES, SCENARIOS, WORK_BEFORE_WAIT_S
from tests.kit.jobs import two_rank_reports


@pytest.fixture(scope="module", params=["cpp", "python"])
def reports(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict]]:
    """Each kernel's two rank reports, from one worker run per kernel shared by this module's tests."""
    kernel = request.param
    native_env = str(request.getfixturevalue("native_probe")) if kernel == "cpp" else "off"
    return kernel, two_rank_reports("tests.kernel_worker", tmp_path_factory.mktemp(kernel), native_env)


def before_scenarios(report: dict) -> list[dict]:
    return sorted(
        (e for e in report["collectives"] if e["start_ns"] < report["scenarios_from_ns"]), key=lambda e: e["start_ns"]
    )


def scenario(report: dict, name: str) -> list[dict]:
    """The operations of one of the worker's waiting scenarios, in issue order."""
    return sorted((e for e in report["collectives"] if e["step"] == SCENARIOS[name]), key=lambda e: e["start_ns"])


def in_flight_ns(event: dict) -> int:
    return event["end_ns"] - event["start_ns"]


def shape(event: dict) -> tuple:
    return (
        event["op"],
        event["group"],
        event["group_size"],
        event["peer"],
        event["bytes"],
        event["dtype"],
        event["step"],
        event["clock"],
    )


@pytest.mark.slow
def test_each_kernel_reports_every_operation_with_its_group_bytes_peer_and_step(
    reports: tuple[str, list[dict]],
) -> None:
    kernel, ranks = reports
    for rank, report in enumerate(ranks):
        assert report["kernel"] == kernel
        assert report["errors"] == []
        peer = 1 - rank
        expected = [
            ("all_reduce", "tp", 2, None, 4000, "float32", 3, "completion"),
            ("all_reduce", "tp", 2, None, 512, "bfloat16", 3, "completion"),  # DTensor's functional path
            ("all_reduce", "tp", 2, None, 4000, "float32", 3, "completion"),
            ("send" if rank == 0 else "recv", "tp", 2, peer, 4000, "float32", 3, "completion"),
            ("reduce_scatter", "tp", 2, None, 4000, "float32", None, "completion"),
            ("broadcast", "tp", 2, None, 80, "int64", None, "completion"),
            ("barrier", "tp", 2, None, 0, None, None, "completion"),
        ]
        collectives = before_scenarios(report)
        assert [shape(e) for e in collectives] == expected, f"rank {rank}"
        assert all(e["start_ns"] <= e["end_ns"] for e in collectives)
        if rank == 0:
            # Rank 1 joined the third all-reduce late: rank 0 waited that long for it to end.
            late = collectives[2]
            assert late["end_ns"] - late["start_ns"] > 0.2e9
            progress = report["progress"]
            assert progress["in_flight"] == 1
            assert (progress["oldest_op"], progress["oldest_group"]) == ("all_reduce", "tp")
            assert progress["oldest_start_ns"] == late["start_ns"]


@pytest.mark.slow
def test_each_kernel_says_how_long_the_caller_waited_for_each_operation(reports: tuple[str, list[dict]]) -> None:
    _kernel, ranks = reports
    late_ns, work_ns = LATE_S * 1e9, WORK_BEFORE_WAIT_S * 1e9
    for rank, report in enumerate(ranks):
        for event in report["collectives"]:
            waited = event["waited_ns"]
            assert waited is None or 0 <= waited <= in_flight_ns(event), (rank, event)
        collectives = before_scenarios(report)
        functional, reduce_scatter = collectives[1], collectives[4]
        assert functional["dtype"] == "bfloat16" and functional["waited_ns"] is None  # wait_tensor waits in C++
        assert reduce_scatter["op"] == "reduce_scatter" and reduce_scatter["waited_ns"] is not None  # ends at its wait
        [done_first] = scenario(report, "done_before_wait")
        assert done_first["waited_ns"] is None, f"rank {rank}: completed before its wait began"

    report = ranks[0]  # rank 1 came late to these: rank 0 surely waited
    [sync] = scenario(report, "sync")
    assert in_flight_ns(sync) > 0.7 * late_ns
    assert sync["waited_ns"] is not None and sync["waited_ns"] > 0.8 * in_flight_ns(sync), sync
    [later] = scenario(report, "waited_in_flight")
    assert in_flight_ns(later) > 0.7 * late_ns
    assert later["waited_ns"] is not None and later["waited_ns"] > 0.2 * in_flight_ns(later), later
    assert in_flight_ns(later) - later["waited_ns"] > 0.5 * work_ns, "the wait began after the work, not at issue"
    first_tp, _other = scenario(report, "two_groups")
    assert first_tp["waited_ns"] is not None


@pytest.mark.slow
def test_each_kernel_says_which_operations_overlapped_another_on_their_group(reports: tuple[str, list[dict]]) -> None:
    _kernel, ranks = reports
    for rank, report in enumerate(ranks):
        assert [e["overlapped"] for e in before_scenarios(report)] == [False] * 7, f"rank {rank}: one at a time"
        for name in ("sync", "done_before_wait", "waited_in_flight"):
            assert [e["overlapped"] for e in scenario(report, name)] == [False], f"rank {rank}: {name}"
        two_groups = scenario(report, "two_groups")
        assert [(e["group"], e["overlapped"]) for e in two_groups] == [("tp", False), ("ranks 0,1", False)], rank
    same_group = scenario(ranks[0], "same_group")  # on rank 0 the first was surely in flight at the second
    assert [(e["group"], e["overlapped"]) for e in same_group] == [("tp", True), ("tp", True)]
    assert same_group[0]["end_ns"] > same_group[1]["start_ns"]


@pytest.mark.slow
def test_the_cpp_kernel_writes_each_event_as_its_json_line_once_python_named_the_group(
    reports: tuple[str, list[dict]],
) -> None:
    kernel, ranks = reports
    for rank, report in enumerate(ranks):
        naming = {e["step"]: e for e in report["collectives"] if e["step"] in NAMING_STEPS.values()}
        assert [
            (naming[step]["op"], naming[step]["group"], naming[step]["bytes"], naming[step]["peer"])
            for step in NAMING_STEPS.values()
        ] == [
            ("all_reduce", ODD_NAMES[0], 40, None),
            ("all_reduce", ODD_NAMES[0], 40, None),
            ("all_reduce", ODD_NAMES[1], 40, None),
        ], f"rank {rank}"
        if kernel == "cpp":
            # Every group the directory named is the C++ kernel's to name, renamed or not; the one group it
            # does not know (two_groups' other) is named in Python from c10d's registry, once.
            assert report["naming_from_lines"] == 3, f"rank {rank}"
            assert report["from_lines"] == len(report["collectives"]) - 1, f"rank {rank}"
        else:
            assert report["from_lines"] == 0


def test_the_environment_says_which_kernel_and_why_there_is_no_cpp_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(native.NATIVE_ENV, "off")
    assert native.from_environment() == (None, None)
    monkeypatch.setenv(native.NATIVE_ENV, "unavailable: cannot build the C++ collective probe: no g++")
    assert native.from_environment() == (None, "cannot build the C++ collective probe: no g++")
    monkeypatch.delenv(native.NATIVE_ENV)
    assert native.from_environment() == (None, "the launcher did not build it")
    monkeypatch.setenv(native.NATIVE_ENV, str(tmp_path / "missing.so"))
    module, why = native.from_environment()
    assert module is None and why is not None and why.startswith("cannot load the C++ collective probe")


@pytest.mark.slow
def test_a_source_that_does_not_compile_is_one_line_and_no_module(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "c10d_kernel.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(native, "SOURCE", broken)
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(native.NATIVE_ENV, raising=False)
    with pytest.raises(ProbeError, match=r"^cannot build the C\+\+ collective probe: ") as raised:
        native.build()
    assert "\n" not in str(raised.value)
    assert native.environment_value().startswith(native.UNAVAILABLE + "cannot build")


def test_each_kernel_forgets_every_work_once_it_ended(reports: tuple[str, list[dict]]) -> None:
    """After every operation ended, nothing is in flight and no map a wait looks works up in holds one (the
    C++ kernel keeps its own: its in-flight count says it)."""
    _, ranks = reports
    for rank, report in enumerate(ranks):
        assert report["left"] == {"in_flight": 0, "waitable": 0, "by_storage": 0}, f"rank {rank}"
