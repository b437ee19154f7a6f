"""Recordings shipped with meshtop: ``meshtop replay`` with no argument opens :data:`SAMPLE`."""

from pathlib import Path

SAMPLE = Path(__file__).resolve().parent / "dp2-pp2-1f1b"
"""A CPU run of the tiny model, dp 2 x pp 2 with 1F1B (made by ``meshtop record``; see README)."""
