"""Recordings shipped with meshtop: ``meshtop replay`` with no argument opens :data:`SAMPLE`."""

from pathlib import Path

SAMPLE = Path(__file__).resolve().parent / "dp2-pp2-1f1b"
"""A CPU run of the tiny model, dp 2 x pp 2 with 1F1B (made by ``meshtop record``; see README)."""

INFER_SAMPLE = Path(__file__).resolve().parent / "tp2-infer"
"""A CPU inference run of the tiny model, tp 2, 24 requests 8 in flight (``meshtop record OUT --mode infer --tp 2
--requests 24 --device cpu``)."""
