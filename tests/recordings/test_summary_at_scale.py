"""``summary`` of a many-rank recording: the benchmark's recording reads as meshtop's own, and the memory
lines name the most loaded ranks and sum up the rest."""

from __future__ import annotations

from pathlib import Path

from meshtop.recordings.metrics.run import COLUMNS_READ, fold_tables
from meshtop.recordings.reader import open_recording
from meshtop.recordings.summary import fold_recording, summarize
from meshtop.tui.summary_text import MEMORY_TOP, summary_lines
from tests.bench.summary_scale import write_fleet_recording


def test_a_fleet_recording_summarises_with_every_event_and_the_highest_peaks_named(tmp_path: Path) -> None:
    ranks, steps = 32, 4
    count = write_fleet_recording(tmp_path / "rec", ranks=ranks, nodes=4, hours=steps * 5 / 3600, step_s=5.0)
    recording = open_recording(tmp_path / "rec")
    per_step = {"stage_action": 16, "collective": 26, "step": 1, "memory": 1}  # 1F1B over 2 stages, 8 microbatches
    for kind, each in per_step.items():
        assert len(recording.arrow(kind)) == ranks * steps * each, kind
    assert len(recording.arrow("gpu")) == ranks * steps * 5 * 10  # each rank's GPU at 10 Hz
    assert sum(len(recording.arrow(kind)) for kind in recording.kinds()) == count
    summary = summarize(recording)
    assert summary["steps"]["count"] == steps
    lines = summary_lines(summary)
    heading = next(i for i, line in enumerate(lines) if line.startswith("memory"))
    assert lines[heading] == f"memory (last step; peak over the run), the {MEMORY_TOP} ranks of highest peak:"
    named = lines[heading + 1 : heading + 1 + MEMORY_TOP]
    peaks = {row["rank"]: row["peak_bytes"] for row in summary["memory"]}
    highest = sorted(peaks, key=lambda rank: (-peaks[rank], rank))[:MEMORY_TOP]
    assert [int(line.split()[1].rstrip(":")) for line in named] == highest
    assert lines[heading + 1 + MEMORY_TOP].startswith(f"  the other {ranks - MEMORY_TOP} ranks: peak ")
    assert "(--json lists every rank)" in lines[heading + 1 + MEMORY_TOP]


def test_a_recording_folded_a_row_group_at_a_time_has_its_whole_tables_figures(tmp_path: Path) -> None:
    write_fleet_recording(tmp_path / "rec", ranks=16, nodes=2, hours=6 * 5 / 3600, step_s=5.0, rows_per_write=700)
    recording = open_recording(tmp_path / "rec")
    batches = [len(batch) for batch in recording.batches("collective", COLUMNS_READ["collective"], rows=500)]
    assert len(batches) == 5 and sum(batches) == len(recording.arrow("collective", ["rank"]))
    kinds = recording.kinds()
    whole = fold_tables(
        recording.manifest.run,
        [(kind, [recording.arrow(kind, COLUMNS_READ.get(kind))]) for kind in kinds],
        status="completed",
    )
    assert fold_recording(open_recording(tmp_path / "rec"), batch_rows=500).figures() == whole.figures()
    assert whole.figures().steps.count == 6 and len(whole.figures().gpus) == 16
