"""The dashboard driven with Textual's pilot over the shipped sample: views, keys, replay controls, snapshots.

The replay's clock is frozen, so the screen moves only when a key moves it:
what the tests see is a function of the recording and the keys alone.
Snapshots are Textual's own (pytest-textual-snapshot's ``snap_compare``): SVG screenshots in
tests/tui/__snapshots__/test_tui_app/, compared by syrupy; after a deliberate change to a screen,
``pytest tests/tui/test_tui_app.py --snapshot-update`` rewrites them (read the diff, or the HTML report
the plugin writes when one fails).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from textual.command import Command, CommandList, CommandPalette

from meshtop.recordings.compare import compare
from meshtop.recordings.reader import open_recording
from meshtop.recordings.summary import summarize
from meshtop.tui.app import MeshtopApp
from meshtop.tui.compare_app import CompareApp
from meshtop.tui.sources import ReplaySource
from meshtop.tui.widgets import ReplayBar
from tests.kit.recordings import fleet_recording
from tests.kit.screen import SnapCompare, screen_text

pytestmark = pytest.mark.screen

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = Path("recordings/samples/dp2-pp2-1f1b")  # relative, so the header reads the same on every machine
INFER_SAMPLE = Path("recordings/samples/tp2-infer")


@pytest.fixture(autouse=True)
def _from_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def replay_app(sample: Path = SAMPLE, at_step: int | None = 31) -> MeshtopApp:
    """The dashboard of ``sample`` replayed, paused at the end of ``at_step`` (``-1``: at its end; ``None``: at
    its start)."""
    source = ReplaySource(open_recording(sample), clock=lambda: 0.0)
    if at_step == -1:
        source.playback.to_end()
        source.playback.paused = True
    elif at_step is not None:
        source.playback.seek_step(at_step - 1)
        source.playback.paused = True
    return MeshtopApp(source)


@asynccontextmanager
async def replay(
    size: tuple[int, int] = (80, 24), at_step: int | None = 31, sample: Path = SAMPLE
) -> AsyncIterator[tuple[MeshtopApp, object]]:
    """The sample's dashboard running (see :func:`replay_app`)."""
    app = replay_app(sample, at_step)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        yield app, pilot


async def press(pilot, *keys: str) -> None:  # type: ignore[no-untyped-def]
    await pilot.press(*keys)
    await pilot.pause()
    await pilot.pause()


VIEW_MARKS = {
    "1": ["step time", "memory per rank", "collectives (busiest)", "alerts"],
    "2": ["process metrics only", "memory per rank (resident set)", "weights"],
    "3": ["collectives by group and op", "all_reduce", "recv", "send"],
    "4": ["stage 0", "stage 1", "bubble per stage", "ideal 20.0% at 2 stages x 4 mb"],
    "5": ["step time", "throughput", "loss"],
    "6": ["pid", "pp/dp/tp", "running"],
    "7": ["blocker: bubble", "try: more microbatches"],
    "8": ["step time · median", "n0 ", "stand out most (step time)"],
}


@pytest.mark.parametrize("key", sorted(VIEW_MARKS))
async def test_each_view_shows_its_figures(key: str) -> None:
    async with replay() as (app, pilot):
        await press(pilot, key)
        text = screen_text(app)
        for mark in VIEW_MARKS[key]:
            assert mark in text, f"view {key} lacks {mark!r}:\n{text}"


async def test_the_header_says_plan_model_step_and_throughput() -> None:
    async with replay() as (app, _pilot):
        header = screen_text(app).splitlines()[:2]
        assert "● replaying  dp2 x tp1 x pp2 (1f1b, 4 mb) · small 6.6M · 4× cpu fp32" in header[0]
        assert header[1].startswith(" step 31/40  1.62 s  p50 2,599 tok/s  elapsed 57.27 s")  # tok/s: over the run


async def test_tab_and_shift_tab_cycle_through_the_views() -> None:
    async with replay() as (app, pilot):
        await press(pilot, "tab", "tab")
        assert "collectives by group and op" in screen_text(app)
        await press(pilot, "shift+tab", "shift+tab", "shift+tab")
        assert "stand out most" in screen_text(app)  # wrapped round to view 8, the grid


async def test_step_keys_move_one_step_and_pause() -> None:
    async with replay() as (app, pilot):
        assert "⏸" in screen_text(app) and "step 31/40" in screen_text(app)
        await press(pilot, "right")
        assert "step 32/40" in screen_text(app)
        await press(pilot, "left", "left")
        assert "step 30/40" in screen_text(app)
        assert app.state.steps_done == 30  # the state was rebuilt from the start, not left at step 32


async def test_space_pauses_and_resumes_and_plus_minus_change_speed() -> None:
    async with replay() as (app, pilot):
        await press(pilot, "space")
        assert "▶" in screen_text(app).splitlines()[-2]
        await press(pilot, "plus", "plus")
        assert screen_text(app).splitlines()[-2].endswith("4x")
        await press(pilot, "minus")
        assert screen_text(app).splitlines()[-2].endswith("2x")
        await press(pilot, "space")
        assert "⏸" in screen_text(app).splitlines()[-2]


async def test_seek_to_a_step_and_to_a_time() -> None:
    async with replay() as (app, pilot):
        await press(pilot, "g", *"12", "enter")
        assert "step 12/40" in screen_text(app)
        await press(pilot, "g", *"1:01", "enter")
        assert "step 33/40  61.0 s" in screen_text(app)
        await press(pilot, "g", *"99", "enter")
        assert app.messages[-1] == "no step 99 in this recording (it has steps 1 to 40)"
        assert "step 33/40" in screen_text(app)  # a bad seek leaves the position alone


async def test_clicking_the_replay_bar_seeks() -> None:
    async with replay() as (app, pilot):
        assert app.source.playback.fraction > 0.7  # paused at step 31 of 40
        await pilot.click(ReplayBar, offset=(3, 0))  # the bar's first cell: the start
        await pilot.pause()
        app.frame()
        await pilot.pause()
        assert app.source.playback.fraction < 0.05


async def test_rank_filter_limits_the_per_rank_views() -> None:
    async with replay() as (app, pilot):
        await press(pilot, "6", "slash", *"2-3", "enter")
        rows = [line.split()[0] for line in screen_text(app).splitlines()[4:12] if line.strip()[:1].isdigit()]
        assert rows == ["2", "3"]
        assert screen_text(app).splitlines()[1].startswith(" [ranks 2-3] step 31/40")
        await press(pilot, "slash", *"pp=x", "enter")
        assert "is not a rank filter" in app.messages[-1]


async def test_processes_view_selects_a_rank_and_a_replay_refuses_new_stack_dumps() -> None:
    async with replay() as (app, pilot):
        await press(pilot, "6", "down", "down")
        from meshtop.tui.views import ProcessesPanel

        assert app.query_one(ProcessesPanel).selected == 2
        await press(pilot, "s")
        assert app.messages[-1].startswith("a replay shows the stack dumps taken while recording")


async def test_a_panel_redraws_only_the_rows_that_changed() -> None:
    from textual.geometry import Region

    from meshtop.tui.views import ProcessesPanel

    async with replay(size=(120, 30)) as (app, pilot):
        await press(pilot, "6")
        panel = app.query_one(ProcessesPanel)
        asked: list[tuple[tuple[Region, ...], bool]] = []
        refresh = panel.refresh

        def spy(*regions: Region, layout: bool = False, **options: bool) -> ProcessesPanel:
            asked.append((regions, layout))
            return refresh(*regions, layout=layout, **options)

        panel.refresh = spy  # type: ignore[method-assign]
        app.redraw()  # a paused replay: nothing changed, nothing to draw
        assert [call for call in asked if call[0] or call[1]] == []
        await press(pilot, "down")  # the highlight moves from rank 0 to rank 1: the table's rows 1 and 2
        assert [call for call in asked if call[0] or call[1]] == [((Region(0, 1, panel.size.width, 2),), False)]
        assert app.query_one(ProcessesPanel).selected == 1


async def test_a_view_key_shows_rows_drawn_before_the_view_is_shown() -> None:
    from textual.widgets import TabbedContent

    from meshtop.tui.views import DevicesPanel

    async with replay(size=(120, 30)) as (app, pilot):
        panel, tabs = app.query_one(DevicesPanel), app.query_one(TabbedContent)
        shown_at: list[str | None] = []
        show = panel.show

        def spy(state: object, ranks: object) -> None:
            shown_at.append(tabs.active)
            show(state, ranks)  # type: ignore[arg-type]

        panel.show = spy  # type: ignore[method-assign]
        await press(pilot, "2")
        # Drawn at the width it is shown at, before it is laid out: the switch draws its rows once.
        assert shown_at[0] == "overview" and panel.hidden_width == panel.size.width
        assert "memory per rank (resident set)" in screen_text(app)


async def test_the_tab_bar_does_not_animate_unless_the_user_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    assert replay_app().animation_level == "none"
    monkeypatch.setenv("TEXTUAL_ANIMATIONS", "full")
    assert replay_app().animation_level == "full"


async def test_help_lists_every_key() -> None:
    async with replay(size=(80, 50)) as (app, pilot):
        await press(pilot, "question_mark")
        text = screen_text(app)
        for description in (
            "Quit",
            "Help",
            "1-8               Views",
            "Next view",
            "Filter",
            "Stack of rank",
            "Pause",
            "Step back",
            "Slower",
            "+, =              Faster",
            "Seek",
            "command palette",
            "the replay bar",
        ):
            assert description in text, description
        await press(pilot, "escape")
        assert "Keys" not in screen_text(app)


async def test_a_live_jobs_help_leaves_out_the_replays_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    async with replay(size=(80, 50)) as (app, pilot):
        monkeypatch.setattr(ReplaySource, "playback", property(lambda self: None))  # as a live source says
        await press(pilot, "question_mark")
        text = screen_text(app)
    assert "Next view" in text and "Filter" in text
    for replay_only in ("Pause", "Step back", "Slower", "Faster", "Seek", "the replay bar"):
        assert replay_only not in text, replay_only


async def test_command_palette_switches_views() -> None:
    """The palette searches its commands on a worker, in batches a quarter of a second apart: enter is pressed
    once the search has put the command typed at the top (however long that takes on a loaded machine)."""
    async with replay() as (app, pilot):
        await press(pilot, "ctrl+p", *"View: Pipeline")
        deadline = asyncio.get_running_loop().time() + 10.0
        while top_command(app) != "View: Pipeline" and asyncio.get_running_loop().time() < deadline:
            await pilot.pause(0.05)
        assert top_command(app) == "View: Pipeline"
        await press(pilot, "enter")
        assert "bubble per stage" in screen_text(app)


def top_command(app: MeshtopApp) -> str | None:
    """The command the open palette would run on enter (its highlighted option: the best match, once found)."""
    if not isinstance(app.screen, CommandPalette):
        return None
    option = app.screen.query_one(CommandList).highlighted_option
    return str(option.hit.text) if isinstance(option, Command) else None


async def test_q_quits_a_replay() -> None:
    async with replay() as (app, pilot):
        await press(pilot, "q")
        assert not app.is_running


async def test_compare_view_marks_real_changes() -> None:
    a = open_recording(SAMPLE)
    comparison = compare(a, a)
    row = comparison["metrics"][0]
    comparison["metrics"].append(
        {**row, "name": "step time (s) [faked slower]", "b": row["a"] * 2, "ratio": 2.0, "significant": True}
    )
    app = CompareApp(comparison, summarize(a), summarize(a))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        assert "+100.0% worse" in text and "+0.0% (noise)" in text
        await press(pilot, "c")  # only the real changes
        text = screen_text(app)
        assert "+100.0% worse" in text and "(noise)" not in text


async def test_compare_shows_both_runs_rank_grids_and_what_stood_out_in_each(tmp_path: Path) -> None:
    """``g``: A's grid (1024 ranks on 16 nodes, node 5 twice as slow) beside B's (none slow), each cell a rank;
    A says 64 ranks and a node stand out, B nothing; ``a`` leaves A's node 5 alone and B none."""
    from meshtop.recordings.summary import fold_recording
    from meshtop.tui.compare_app import RunGrid

    recordings = [
        open_recording(fleet_recording(tmp_path / name, ranks=1024, nodes=16, slow_node=slow))
        for name, slow in (("before", 5), ("after", None))
    ]
    folds = fold_recording(recordings[0]), fold_recording(recordings[1])
    grids = RunGrid.of(folds[0]), RunGrid.of(folds[1])
    app = CompareApp(compare(*recordings, folds), *map(summarize, recordings), grids)  # type: ignore[call-arg]
    async with app.run_test(size=(200, 60)) as pilot:

        def halves() -> tuple[str, str]:
            rows = screen_text(app).splitlines()
            return "\n".join(row[:100] for row in rows), "\n".join(row[100:] for row in rows)

        def node_rows(text: str) -> list[str]:
            return [line.strip() for line in text.splitlines() if line.strip().startswith("n") and " node" in line]

        await press(pilot, "g")
        text_a, text_b = halves()
        assert "64 rank(s), 1 node(s) stand out" in text_a and "nothing stands out" in text_b, text_a + text_b
        for text in (text_a, text_b):
            assert len(node_rows(text)) == 16 and all(row.count("█") == 64 for row in node_rows(text)), text
        await press(pilot, "a")
        text_a, text_b = halves()
        assert [row[:8] for row in node_rows(text_a)] == ["n5 node5"], text_a
        assert "no rank or node stands out" in text_b
        await press(pilot, "g")
        assert "step time (s)" in screen_text(app)  # back to the table


SNAPSHOT_VIEWS = {
    "overview": "1",
    "devices": "2",
    "comms": "3",
    "pipeline": "4",
    "steps": "5",
    "procs": "6",
    "alerts": "7",
    "grid": "8",
}
SNAPSHOT_SAMPLES = {"train": (SAMPLE, 31), "infer": (INFER_SAMPLE, -1)}
"""The training sample at its step 31, the inference sample at its end."""


@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
@pytest.mark.parametrize("view", sorted(SNAPSHOT_VIEWS))
@pytest.mark.parametrize("sample", sorted(SNAPSHOT_SAMPLES))
def test_screen_snapshot(sample: str, view: str, size: tuple[int, int], snap_compare: SnapCompare) -> None:
    recording, at_step = SNAPSHOT_SAMPLES[sample]
    assert snap_compare(replay_app(recording, at_step), press=[SNAPSHOT_VIEWS[view]], terminal_size=size)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["replay", "no/such/recording"], "no/such/recording does not exist"),
        (["replay", "--speed", "0"], "--speed must be above 0"),
        (["replay", "--paused-at", "99"], "no step 99 in this recording"),
        (
            ["replay"],
            "meshtop replay draws a dashboard, but standard output is not a terminal: use `meshtop summary REC`",
        ),
        (["compare", str(SAMPLE), str(SAMPLE), "--tui"], "leave out --tui for the comparison as text"),
    ],
)
def test_dashboard_commands_refuse_bad_input_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from meshtop.tui.cli import main

    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err


@pytest.mark.parametrize("width", [80, 160])
async def test_devices_view_draws_gpu_samples_with_history_clock_and_temperature(width: int) -> None:
    from tests.kit.events import gpu_sample  # NVML readings as the GPU sampler would send them (no GPU here)

    async with replay(size=(width, 30)) as (app, pilot):
        app.state.apply_events(
            gpu_sample(
                gpu=0,
                wall_ns=i,
                name="NVIDIA H200",
                memory_used_bytes=70 << 30,
                memory_total_bytes=141 << 30,
                utilization_pct=float(50 + i),
                power_w=300.0 + i,
                sm_clock_mhz=1980.0,
                temperature_c=61.0,
                nvlink_tx_bytes_per_s=6.5e9 if i == 10 else 2.5e9,
                nvlink_rx_bytes_per_s=2.5e9,
            )
            for i in range(40)
        )
        await press(pilot, "2")
        app.frame()
        await pilot.pause()
        rows = screen_text(app).splitlines()
        at = next(i for i, row in enumerate(rows) if "GPU 0" in row)
        first, second = rows[at], rows[at + 1]
        assert "NVIDIA H200" in first and " 89%" in first and first.rstrip().endswith(" 339 W")
        assert second.strip() == "1980 MHz  61°C  mem 70.0 GiB/141.0 GiB  NVLink tx 2.5GB/s rx 2.5GB/s"
        # the run's link figures, the metrics core's: tx mean (39 x 2.5 + 6.5) / 40 = 2.6 GB/s, peak 6.5 GB/s
        assert rows[at + 2].strip() == "links over the run, mean/peak: NVLink tx 2.6G/6.5GB/s rx 2.5G/2.5GB/s"
        assert "process metrics only" not in screen_text(app)


@pytest.mark.parametrize(("ranks", "nodes", "size"), [(1024, 16, (200, 60)), (64, 8, (80, 24))])
async def test_the_rank_grid_picks_out_the_slow_node(
    ranks: int, nodes: int, size: tuple[int, int], tmp_path: Path
) -> None:
    """A simulated job whose node 5 runs its steps at twice the time: every rank a cell, the node's row and its
    ranks flagged, and with the attention filter that node's row alone."""
    recording = fleet_recording(tmp_path / "fleet", ranks=ranks, nodes=nodes, slow_node=5)
    per_node = ranks // nodes
    async with replay(size=size, at_step=-1, sample=recording) as (app, pilot):
        await press(pilot, "8")
        text = screen_text(app)
        assert f"{per_node} rank(s), 1 node(s) stand out" in text, text
        rows = [line for line in text.splitlines() if line.lstrip("│ ").startswith(("n0 ", "n5 ", f"n{nodes - 1} "))]
        assert len(rows) == 3 and all(line.count("█") == per_node for line in rows), text
        assert f"rank {5 * per_node:<5} n5" in text  # the top of the list: a rank of node 5
        await press(pilot, "a")
        text = screen_text(app)
        assert "n5 node5" in text and "n4 node4" not in text and "n0 node0" not in text, text
        await press(pilot, "m")
        assert "exposed communication" in screen_text(app)
        await press(pilot, "m", "m", "m", "m")  # back to step time, past data, bubble and headroom
        await press(pilot, "down", "enter")  # the second of those that stand out most: its process
        from meshtop.tui.views import ProcessesPanel

        slowest = sorted(range(5 * per_node, 6 * per_node), key=lambda rank: (-(rank % 3), rank))  # the fleet's
        assert app.query_one(ProcessesPanel).selected == slowest[1]
        assert f"{slowest[1]}  n5 node5" in screen_text(app)
