"""The text a Textual app shows, row by row (for tests and benchmarks that read the screen)."""

from __future__ import annotations

from textual.app import App


def screen_text(app: App[object]) -> str:
    """Every row of the current screen as plain text, trailing spaces cut."""
    strips = app.screen._compositor.render_strips()
    return "\n".join(strip.text.rstrip() for strip in strips)
