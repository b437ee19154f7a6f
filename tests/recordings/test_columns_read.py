"""A recording read by only the columns the fold reads (:data:`~meshtop.recordings.metrics.run.COLUMNS_READ`)
folds as the whole recording does."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from meshtop.probes.kinds import FOLD_ORDER
from meshtop.recordings.metrics.run import COLUMNS_READ, RunFold
from meshtop.recordings.reader import open_recording
from meshtop.recordings.samples import SAMPLE
from meshtop.recordings.summary import fold_recording, summarize
from tests.kit.recordings import write_recording


def test_a_recording_read_by_the_columns_the_fold_reads_folds_as_the_whole_recording(tmp_path: Path) -> None:
    whole = open_recording(SAMPLE)
    kinds = whole.kinds()
    fold = RunFold(whole.manifest.run)
    for kind in sorted(kinds, key=FOLD_ORDER.__getitem__):
        fold.apply(kind, whole.arrow(kind))
    fold.finish("completed")
    assert fold_recording(open_recording(SAMPLE)).figures() == fold.figures()

    # A row without a value its event needs, in a column the fold does not read, is left out either way.
    table = pq.read_table(SAMPLE / "events" / "collective.parquet")
    clock = table.column("clock").to_pylist()
    clock[3] = None
    damaged = tmp_path / "damaged"
    write_recording(damaged, [], run=whole.manifest.run)
    (damaged / "events").mkdir(exist_ok=True)
    pq.write_table(
        table.set_column(table.schema.get_field_index("clock"), "clock", pa.array(clock, pa.string())),
        damaged / "events" / "collective.parquet",
    )
    read = open_recording(damaged)
    assert len(read.arrow("collective", COLUMNS_READ["collective"])) == len(table) - 1
    assert read.arrow("collective", COLUMNS_READ["collective"]).equals(
        open_recording(damaged).arrow("collective").select(list(COLUMNS_READ["collective"]))
    )
    assert summarize(open_recording(damaged))["collectives"]
