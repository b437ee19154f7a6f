"""The text a running Textual app shows, row by row, read through its public screenshot export."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from pathlib import Path

from rich.cells import cell_len
from textual.app import App

from meshtop.recordings.reader import open_recording
from meshtop.tui.sources import ReplaySource
from meshtop.tui.state import DashboardState

SVG = "{http://www.w3.org/2000/svg}"
LINE = re.compile(r"-line-(\d+)\)$")

SnapCompare = Callable[..., bool]
"""pytest-textual-snapshot's ``snap_compare`` fixture: ``snap_compare(app, press=[...], terminal_size=(w, h))``
runs ``app``, presses the keys, and compares its SVG screenshot with the one on file."""


def screen_text(app: App[object]) -> str:
    """Every row of the current screen as plain text, trailing spaces cut, read from
    :meth:`App.export_screenshot`."""
    return svg_text(app.export_screenshot(), *app.size)


def svg_text(screenshot: str, width: int, height: int) -> str:
    """The rows of a ``width`` x ``height`` screenshot as Rich draws it in SVG (one ``text`` element per run of
    characters that share a style, clipped to its row, at ``x`` = column times the width of a cell)."""
    svg = ElementTree.fromstring(screenshot)
    clips = {clip.get("id"): clip for clip in svg.iter(f"{SVG}clipPath")}
    first_line = next(clip for name, clip in clips.items() if name and name.endswith("-line-0"))
    cell_width = float(next(first_line.iter(f"{SVG}rect")).get("width", "0")) / width
    runs: list[list[tuple[int, str]]] = [[] for _ in range(height)]
    for text in svg.iter(f"{SVG}text"):
        line = LINE.search(text.get("clip-path", ""))
        if line is not None:
            runs[int(line.group(1))].append((round(float(text.get("x", "0")) / cell_width), text.text or ""))
    rows = []
    for row in runs:
        cells, column = [], 0
        for at, characters in sorted(row):
            cells.append(" " * (at - column) + characters)
            column = at + cell_len(characters)
        rows.append("".join(cells).replace("\xa0", " ").rstrip())
    return "\n".join(rows)


def replayed(recording: Path) -> DashboardState:
    """The dashboard's state after a replay of the whole recording, through the replay source."""
    opened = open_recording(recording)
    source = ReplaySource(opened, clock=lambda: 0.0)
    source.playback.seek_fraction(1.0)
    state = DashboardState(opened.manifest.run)
    while not source.caught_up:
        state = source.poll(state)
    return state
