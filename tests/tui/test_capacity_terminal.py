"""``meshtop replay OUT`` on a capacity sweep in a real terminal (:mod:`tests.kit.terminal`): the sweep's view,
Enter into a run's dashboard, q back to the sweep, q out with exit code 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kit.recordings import write_recording
from tests.kit.terminal import TMUX, Terminal
from tests.recordings.test_capacity_by_hand import at_rate_2, endpoint_run, sweep_file

pytestmark = [pytest.mark.screen, pytest.mark.slow]

if TMUX is None:
    pytest.skip("tmux is not installed: the real-terminal tests need it", allow_module_level=True)


def test_enter_replays_the_run_at_capacity_and_q_comes_back_to_the_sweep(terminal: object, tmp_path: Path) -> None:
    """The configuration under the cursor is batch=1, whose run at capacity is rate 2: Enter replays that
    recording (its endpoint in the dashboard's header), q closes it and the sweep's view is back, q ends."""
    out = tmp_path / "sweep"
    write_recording(out / "batch-1" / "rate-2", at_rate_2(), run=endpoint_run(2.0))
    sweep_file(out, runs=[
        {"config": "batch=1", "rate": 2.0, "status": "completed", "recording": "batch-1/rate-2", "reason": None},
    ])  # fmt: skip
    view: Terminal = terminal(["replay", str(out)], width=120, height=40)  # type: ignore[operator]
    screen = view.wait_text("capacity sweep")
    assert "batch=1" in screen and "batch=2" in screen, screen
    view.press("Enter")
    dashboard = view.wait_text("127.0.0.1:9")
    assert "capacity sweep" not in dashboard, dashboard
    view.press("q")
    view.wait_text("capacity sweep")
    view.press("q")
    assert view.wait_exit() == 0
