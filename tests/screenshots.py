"""Write the README's screenshots (SVG) of the dashboard replaying the shipped sample.

    python -m tests.screenshots [OUT_DIR]      # default docs/screens

The replay clock is frozen at the end of step 31, as in the snapshot tests.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from meshtop.recordings.compare import compare
from meshtop.recordings.reader import open_recording
from meshtop.recordings.summary import fold_recording, summarize
from meshtop.tui.app import MeshtopApp
from meshtop.tui.compare_app import CompareApp, RunGrid
from meshtop.tui.sources import ReplaySource

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = Path("recordings/samples/dp2-pp2-1f1b")
VIEWS = {"overview": "1", "devices": "2", "comms": "3", "pipeline": "4", "steps": "5", "procs": "6"}
SIZE = (110, 30)


async def dashboard(out: Path) -> None:
    source = ReplaySource(open_recording(SAMPLE), clock=lambda: 0.0)
    source.playback.seek_step(30)
    source.playback.paused = True
    app = MeshtopApp(source)
    async with app.run_test(size=SIZE) as pilot:
        for name, key in VIEWS.items():
            await pilot.press(key)
            await pilot.pause()
            await pilot.pause()
            app.save_screenshot(f"{name}.svg", path=str(out))


async def comparison(out: Path, other: Path | None) -> None:
    a = open_recording(SAMPLE)
    b = open_recording(other) if other else a
    folds = fold_recording(a), fold_recording(b)
    app = CompareApp(compare(a, b, folds), summarize(a), summarize(b), (RunGrid.of(folds[0]), RunGrid.of(folds[1])))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.save_screenshot("compare.svg", path=str(out))


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "screens"
    other = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    out.mkdir(parents=True, exist_ok=True)
    import os

    os.chdir(ROOT)
    asyncio.run(dashboard(out.resolve()))
    asyncio.run(comparison(out.resolve(), other))
    print(f"screenshots in {out}")


if __name__ == "__main__":
    main()
