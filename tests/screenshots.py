"""Write the README's screenshots (SVG) of the dashboard replaying the shipped sample.

    python -m tests.screenshots [OUT_DIR] [OTHER]      # default docs/screens; OTHER: compare's second run
    python -m tests.screenshots OUT_DIR --recording REC --views devices --step 18 --prefix gpu-

The replay clock is frozen at the end of step 31 (``--step``: another), as in the snapshot tests.
"""

from __future__ import annotations

import argparse
import asyncio
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


async def dashboard(
    out: Path, recording: Path = SAMPLE, views: tuple[str, ...] = tuple(VIEWS), step: int = 30, prefix: str = ""
) -> None:
    source = ReplaySource(open_recording(recording), clock=lambda: 0.0)
    source.playback.seek_step(step)
    source.playback.paused = True
    app = MeshtopApp(source)
    async with app.run_test(size=SIZE) as pilot:
        for name in views:
            await pilot.press(VIEWS[name])
            await pilot.pause()
            await pilot.pause()
            app.save_screenshot(f"{prefix}{name}.svg", path=str(out))


async def comparison(out: Path, other: Path | None) -> None:
    a = open_recording(SAMPLE)
    b = open_recording(other) if other else a
    folds = fold_recording(a), fold_recording(b)
    app = CompareApp(compare(a, b, folds), summarize(a), summarize(b), (RunGrid.of(folds[0]), RunGrid.of(folds[1])))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.save_screenshot("compare.svg", path=str(out))


def main() -> None:
    parser = argparse.ArgumentParser(description="the README's screenshots (SVG) of the dashboard")
    parser.add_argument("out", type=Path, nargs="?", default=ROOT / "docs" / "screens")
    parser.add_argument("other", type=Path, nargs="?", help="compare's second run (default: the sample again)")
    parser.add_argument("--recording", type=Path, help="replay this recording instead of the sample (no compare)")
    parser.add_argument("--views", default=",".join(VIEWS), help=f"comma-separated, of {', '.join(VIEWS)}")
    parser.add_argument("--step", type=int, default=30, help="the replay frozen at this step's end")
    parser.add_argument("--prefix", default="", help="put before each file's name")
    args = parser.parse_args()
    views = tuple(args.views.split(","))
    if unknown := set(views) - set(VIEWS):
        parser.error(f"unknown views {sorted(unknown)}: choose from {', '.join(VIEWS)}")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    recording = args.recording.resolve() if args.recording else SAMPLE
    import os

    os.chdir(ROOT)
    asyncio.run(dashboard(out, recording, views, args.step, args.prefix))
    if args.recording is None:
        asyncio.run(comparison(out, args.other))
    print(f"screenshots in {out}")


if __name__ == "__main__":
    main()
