"""``meshtop replay OUT`` on a capacity sweep, driven with Textual's pilot: the ranked configurations, the chart of
the one under the cursor, and Enter on a run ending the app with that run's recording (a real one: the shipped
inference sample, copied where the report says the run's recording is). Its screen snapshots are Textual's own, as
the dashboard's (see tests/tui/test_tui_app.py)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from meshtop.recordings.reader import open_recording
from meshtop.recordings.samples import INFER_SAMPLE
from meshtop.tui.capacity_app import CapacityApp, config_charts, run_cells, run_index
from tests.kit.screen import SnapCompare, screen_text

pytestmark = pytest.mark.screen


def run(config: str, rate: float, recording: str | None, **figures: Any) -> dict[str, Any]:
    """A run of the capacity report, passed unless ``figures`` say otherwise."""
    return {
        "config": config,
        "rate": rate,
        "achieved_rate": rate,
        "attainment": 1.0,
        "met": True,
        "saturated": False,
        "client_limited": False,
        "recording": recording,
        "status": "completed",
        "ttft_p50_s": 0.05,
        "ttft_p99_s": 0.1,
        "tpot_p50_s": 0.01,
        "tpot_p99_s": 0.02,
        "blocker": None,
        "why": None,
    } | figures


@pytest.fixture
def report(tmp_path: Path) -> dict[str, Any]:
    """Two configurations: ``a=1`` passes rates 1 and 2 and saturates at 4 (whose recording is missing); ``a=2``
    misses the SLO at rate 1. The recordings that exist are copies of the shipped inference sample."""
    out = tmp_path / "out"
    for folder in ("a-1/rate-1", "a-1/rate-2", "a-2/rate-1"):
        shutil.copytree(INFER_SAMPLE, out / folder)
    queue = {"kind": "queue", "evidence": "waiting requests grew through the run", "suggestion": "add replicas"}
    return {
        "sweep": str(out),
        "kind": "capacity",
        "search": "rate",
        "slo": {"ttft_s": 0.5, "tpot_s": 0.05},
        "attainment": 0.95,
        "users": {"users": 200, "rate_per_user": 0.05, "offered_per_s": 10.0},
        "capacity": [
            {
                "config": "a=1",
                "requests_per_s": 2.0,
                "per_gpu": 2.0,
                "gpus": 1,
                "rate": 2.0,
                "ttft_p99_s": 0.2,
                "tpot_p99_s": 0.03,
                "limited_by": "queue",
                "recording": "a-1/rate-2",
                "needed": 5,
                "needed_gpus": 5,
                "reason": None,
            },
            {
                "config": "a=2",
                "requests_per_s": 0.0,
                "per_gpu": 0.0,
                "gpus": 2,
                "rate": None,
                "ttft_p99_s": None,
                "tpot_p99_s": None,
                "limited_by": "latency",
                "recording": None,
                "needed": None,
                "needed_gpus": None,
                "reason": "no rate passed",
            },
        ],
        "runs": [
            run("a=1", 1.0, "a-1/rate-1"),
            run("a=1", 2.0, "a-1/rate-2", ttft_p99_s=0.2, tpot_p99_s=0.03),
            run(
                "a=1",
                4.0,
                "a-1/rate-4",
                achieved_rate=2.5,
                attainment=0.4,
                met=False,
                saturated=True,
                ttft_p99_s=3.0,
                blocker=queue,
                why="saturated: achieved 2.5 of 4 req/s",
            ),
            run("a=2", 1.0, "a-2/rate-1", attainment=0.5, met=False, tpot_p99_s=0.09, why="SLO met by 50 %"),
        ],
    }


def drive(app: CapacityApp, *keys: str, size: tuple[int, int] = (100, 30)) -> tuple[str, Path | None]:
    """Run ``app``, press ``keys``; the screen's text after them, and what the app ended with (``None`` when
    it is still running, or quit)."""

    async def pressing() -> str:
        async with app.run_test(size=size, notifications=True) as pilot:
            await pilot.pause()
            await pilot.press(*keys)
            await pilot.pause()
            return screen_text(app)

    return asyncio.run(pressing()), app.return_value


def test_enter_on_a_run_ends_the_app_with_its_recording_and_the_loop_finds_the_run_again(
    report: dict[str, Any],
) -> None:
    _, chosen = drive(CapacityApp(report), "tab", "down", "enter")
    out = Path(report["sweep"])
    assert chosen == out / "a-1/rate-2"
    assert open_recording(chosen).path == chosen  # a recording the dashboard replays
    assert run_index(report, chosen) == 1
    _, again = drive(CapacityApp(report, cursor=3), "enter")  # back from the dashboard: on the run it replayed
    assert again == out / "a-2/rate-1"


def test_enter_on_a_configuration_replays_its_run_at_capacity_and_q_ends_with_nothing(report: dict[str, Any]) -> None:
    assert drive(CapacityApp(report), "enter")[1] == Path(report["sweep"]) / "a-1/rate-2"
    assert drive(CapacityApp(report), "down", "q")[1] is None


def test_a_run_without_its_recording_or_a_configuration_without_capacity_stays_and_says_so(
    report: dict[str, Any],
) -> None:
    screen, chosen = drive(CapacityApp(report, cursor=2), "enter")
    assert chosen is None and "a-1/rate-4: the run left no recording" in screen
    screen, chosen = drive(CapacityApp(report), "down", "enter")
    assert chosen is None and "no recording here" in screen


def test_at_80x24_the_head_the_ranking_and_the_chart_of_the_configuration_under_the_cursor_fit(
    report: dict[str, Any],
) -> None:
    screen, _ = drive(CapacityApp(report), size=(80, 24))
    lines = screen.splitlines()
    assert lines[0].startswith(" capacity sweep · 2 configurations, 4 runs, by rate · /")
    assert lines[1].startswith(" SLO TTFT ≤ 500.0 ms, TPOT ≤ 50.0 ms for 95% of requests · offered 10.00 req/s")
    assert " 1  a=1      2.00     2.00     1  200.0 ms   30.0 ms  queue" in screen
    assert " -  a=2      0.00     0.00     2         -         -  latency" in screen
    assert " a=1  ● passed × missed ▲ saturated ○ client-limited" in screen
    assert "TTFT p99 (ms) by rate (req/s)" in screen and "TPOT p99 (ms) by rate (req/s)" in screen
    assert "capacity 2.00 req/s (2.00 per GPU, rate 2) · limited by queue" in screen
    assert "↑" in screen  # rate 4's TTFT of 3 s, above 3 x the SLO
    assert " ▲  a=1        4      2.50      40%  no   yes" in screen  # the runs table
    screen, _ = drive(CapacityApp(report), "down", size=(80, 24))
    assert " a=2  ●" in screen and "no capacity · limited by latency · no rate passed" in screen
    screen, _ = drive(CapacityApp(report), "tab", "down", "down", size=(80, 24))
    assert "rate 4 · saturated: achieved 2.5 of 4 req/s · blocker queue:" in screen  # the run under the cursor


def test_the_charts_stand_side_by_side_when_two_fit_and_stack_when_not(report: dict[str, Any]) -> None:
    wide = config_charts(report, "a=1", width=100, height=14).plain.splitlines()
    assert len(wide) == 14 and max(len(line) for line in wide) <= 100
    assert "TTFT p99" in wide[1] and "TPOT p99" in wide[1]
    narrow = config_charts(report, "a=1", width=60, height=14, run=2).plain.splitlines()
    assert len(narrow) == 14 and max(len(line) for line in narrow) <= 60
    assert "TTFT p99" in narrow[1] and "TPOT p99" in narrow[7]  # 6 lines each
    assert narrow[-1].startswith("rate 4 · saturated")


def test_a_runs_row_marks_and_colours_what_kept_it_from_passing(report: dict[str, Any]) -> None:
    passed, _, saturated, missed = (run_cells(this) for this in report["runs"])
    assert [cell.plain for cell in saturated[:8]] == ["▲", "a=1", "4", "2.50", "40%", "no", "yes", "no"]
    assert saturated[5].style == "bold red" and saturated[6].style == "yellow" and passed[5].style == "green"
    assert saturated[-1].plain == "saturated: achieved 2.5 of 4 req/s" and passed[-1].plain == ""
    assert missed[0].plain == "×" and missed[0].style == "bold red"
    not_run = run_cells(run("a=2", 2.0, None, met=None, saturated=None, client_limited=None, status="not run"))
    assert [cell.plain for cell in not_run[5:8]] == ["-", "-", "-"] and not_run[-1].plain == "not run"


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_screen_snapshot(report: dict[str, Any], size: tuple[int, int], snap_compare: SnapCompare) -> None:
    on_a_run = CapacityApp(report | {"sweep": "sweeps/capacity"}, cursor=2)  # the same path on every machine
    assert snap_compare(on_a_run, terminal_size=size)
