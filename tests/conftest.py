"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs import launch


@pytest.fixture
def launch_cpu(tmp_path: Path):
    return lambda **spec: launch(tmp_path, **spec)
