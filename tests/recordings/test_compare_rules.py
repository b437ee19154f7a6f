"""compare's rules worked by hand: when a change is beyond noise, and when two endpoint runs sent other loads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from meshtop.recordings.compare import metric, unfair_differences
from meshtop.recordings.manifest import LOAD_FILE, Endpoint
from meshtop.recordings.reader import open_recording
from tests.kit.recordings import elastic_script, write_recording


def test_a_change_past_1_percent_that_is_noise_is_not_significant() -> None:
    """A: 1, 3, ..., 19 and B: 2, 4, ..., 20 interleave: of the 100 pairs A wins U = 0 + 1 + ... + 9 = 45, the
    mean being 50 and the spread sqrt(10 x 10 x 21 / 12) = 13.2: z = (45 - 50 + 0.5) / 13.2 = -0.34, p = 0.73.
    Their medians 10 and 11 move by 10 %, but that is noise: not significant. Both rules must hold."""
    a, b = np.arange(1.0, 20.0, 2.0), np.arange(2.0, 21.0, 2.0)
    row = metric("step time (s)", 10.0, 11.0, (a, b))
    assert row["ratio"] == pytest.approx(1.1) and not row["significant"]


def test_a_change_beyond_noise_but_under_1_percent_is_not_significant() -> None:
    """A: 1.000 to 1.009 and B: 1.010 to 1.019 (10 each) do not overlap: U = 0, z = (0 - 50 + 0.5) / 13.2 = -3.74,
    p = 0.0002, past 0.01. Their medians 1.0045 and 1.0145 move by 1.0 %, not more than 1 %: not significant;
    B at 1.0245 (2 %): significant."""
    a = 1.0 + np.arange(10) / 1000
    b = a + 0.010
    small = metric("step time (s)", float(np.median(a)), float(np.median(b)), (a, b))
    assert small["ratio"] == pytest.approx(1.0145 / 1.0045) and not small["significant"]
    large = metric("step time (s)", float(np.median(a)), float(np.median(b + 0.010)), (a, b + 0.010))
    assert large["significant"]


def endpoint_run(directory: Path, load: list[str]) -> Path:
    """An endpoint run's recording whose ``load.jsonl`` holds ``load``."""
    endpoint = Endpoint(url="http://127.0.0.1:8000/v1", api="completions", model="m")
    run = dataclasses.replace(elastic_script(1), mode="infer", script=None, endpoint=endpoint)
    write_recording(directory, [], run=run)
    (directory / LOAD_FILE).write_text("".join(line + "\n" for line in load))
    return directory


def test_two_endpoint_runs_that_sent_other_requests_are_warned_about(tmp_path: Path) -> None:
    """Three requests each; the second's prompt differs: 1 of 3 differ. One more request sent by B: 2 of 4."""
    sent = ['{"offset_s": 0.0, "prompt": "a"}', '{"offset_s": 0.5, "prompt": "b"}', '{"offset_s": 1.0, "prompt": "c"}']
    a = open_recording(endpoint_run(tmp_path / "a", sent))
    same = open_recording(endpoint_run(tmp_path / "same", sent))
    other = open_recording(endpoint_run(tmp_path / "b", [sent[0], sent[1].replace('"b"', '"B"'), sent[2]]))
    longer = open_recording(endpoint_run(tmp_path / "c", [*sent[:2], sent[2].replace('"c"', '"C"'), sent[2]]))
    assert unfair_differences(a, same) == []
    [warning] = unfair_differences(a, other)
    assert warning.startswith("the runs sent different loads: 1 of 3 requests differ in prompt, length or send offset")
    assert unfair_differences(a, longer)[0].startswith("the runs sent different loads: 2 of 4 requests differ")
