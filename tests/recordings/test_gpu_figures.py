"""Each GPU's figures from its NVML samples, by hand: the peak of the whole device's memory used, the mean
utilisation over the samples that read it, the mean and peak of each link rate (PCIe and NVLink, tx and rx):
over the run, or over the load's window for a serving run; the same whether the samples come as events or as
a table."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshtop.probes.events import RequestDone
from meshtop.recordings.compare import compare
from meshtop.recordings.metrics.gpus import GpuFold, GpuRow, first_sample_of_each_gpu
from meshtop.recordings.metrics.run import RunFold
from meshtop.recordings.reader import Recording, open_recording
from meshtop.recordings.schema import table_of
from meshtop.recordings.summary import summarize
from meshtop.tui.summary_text import comparison_lines, summary_lines
from tests.kit.events import NO_LINKS, fold_events, gpu_sample
from tests.kit.recordings import description, write_recording

GIB = 1 << 30
GB = 1e9
SAMPLES = [
    gpu_sample(gpu=0, wall_ns=1, name="NVIDIA H200", memory_used_bytes=70 * GIB, memory_total_bytes=141 * GIB,
               utilization_pct=40.0),  # no link rate yet: PCIe not read, NVLink needs two readings
    gpu_sample(gpu=0, wall_ns=2, name="NVIDIA H200", memory_used_bytes=120 * GIB, memory_total_bytes=141 * GIB,
               utilization_pct=None,  # the reading failed: no utilisation this sample
               pcie_tx_bytes_per_s=1000.0, pcie_rx_bytes_per_s=4000.0,
               nvlink_tx_bytes_per_s=3 * GB, nvlink_rx_bytes_per_s=1 * GB),
    gpu_sample(gpu=0, wall_ns=3, name="NVIDIA H200", memory_used_bytes=90 * GIB, memory_total_bytes=141 * GIB,
               utilization_pct=80.0, pcie_tx_bytes_per_s=7000.0, pcie_rx_bytes_per_s=1000.0,
               nvlink_tx_bytes_per_s=5 * GB, nvlink_rx_bytes_per_s=3 * GB),
    gpu_sample(gpu=1, wall_ns=1, node=1, name=None, memory_used_bytes=None, utilization_pct=10.0),
]  # fmt: skip
LINKS_BY_HAND = {
    "pcie_tx": {"mean": (1000 + 7000) / 2, "peak": 7000.0},
    "pcie_rx": {"mean": (4000 + 1000) / 2, "peak": 4000.0},
    "nvlink_tx": {"mean": (3 + 5) / 2 * GB, "peak": 5 * GB},
    "nvlink_rx": {"mean": (1 + 3) / 2 * GB, "peak": 3 * GB},
}
EXPECTED = [
    GpuRow(node=0, gpu=0, name="NVIDIA H200", samples=3, peak_used_bytes=120 * GIB, total_bytes=141 * GIB,
           utilization_mean_pct=60.0, links=LINKS_BY_HAND, links_over="run"),
    GpuRow(node=1, gpu=1, name=None, samples=1, peak_used_bytes=None, total_bytes=None, utilization_mean_pct=10.0,
           links=NO_LINKS, links_over="run"),
]  # fmt: skip


def test_each_gpu_peak_and_mean_utilisation_by_hand() -> None:
    fold = GpuFold()
    fold.add(table_of(SAMPLES))
    assert fold.rows() == EXPECTED
    assert GpuFold().rows() == []
    assert EXPECTED[0].utilization_mean_pct == pytest.approx((40 + 80) / 2)
    halves = GpuFold()  # two tables: the sums of each span add up, the peak is the larger
    halves.add(table_of(SAMPLES[:2]))
    halves.add(table_of(SAMPLES[2:]))
    assert halves.rows() == EXPECTED
    unread_first = GpuFold()  # a first table that read no link rate adds nothing to the sums (not 1 B/s)
    unread_first.add(table_of(SAMPLES[:1]))
    unread_first.add(table_of(SAMPLES[1:]))
    assert unread_first.rows() == EXPECTED


def test_each_gpus_first_sample_is_found_by_node_and_index() -> None:
    """GPU indexes repeat from node to node; the first row of each (node, gpu) is the one kept."""
    samples = [
        gpu_sample(gpu=0, wall_ns=1, name="H200", node=0),
        gpu_sample(gpu=0, wall_ns=2, name="H200 later", node=0),
        gpu_sample(gpu=0, wall_ns=3, name="A100", node=1),
        gpu_sample(gpu=1, wall_ns=4, name=None, node=0, power_limit_w=700.0),
    ]
    assert first_sample_of_each_gpu(table_of(samples), ["name", "power_limit_w"]) == {
        (0, 0): ("H200", None),
        (1, 0): ("A100", None),
        (0, 1): (None, 700.0),
    }
    assert first_sample_of_each_gpu(table_of(samples).slice(0, 0), ["name"]) == {}


SERVED = [  # 10 s apart: the weight load, the load's window from 20 s to 40 s, the idle after
    gpu_sample(gpu=0, wall_ns=10 * 10**9, pcie_rx_bytes_per_s=20 * GB, pcie_tx_bytes_per_s=0.0),
    gpu_sample(gpu=0, wall_ns=20 * 10**9, pcie_rx_bytes_per_s=2 * GB, pcie_tx_bytes_per_s=1 * GB,
               nvlink_tx_bytes_per_s=40 * GB, nvlink_rx_bytes_per_s=30 * GB),
    gpu_sample(gpu=0, wall_ns=30 * 10**9, pcie_rx_bytes_per_s=2 * GB, pcie_tx_bytes_per_s=1 * GB,
               nvlink_tx_bytes_per_s=60 * GB, nvlink_rx_bytes_per_s=50 * GB),  # PCIe: the reading repeated
    gpu_sample(gpu=0, wall_ns=40 * 10**9, pcie_rx_bytes_per_s=5 * GB, pcie_tx_bytes_per_s=4 * GB,
               nvlink_tx_bytes_per_s=20 * GB, nvlink_rx_bytes_per_s=10 * GB),
    gpu_sample(gpu=0, wall_ns=50 * 10**9, pcie_rx_bytes_per_s=0.0, pcie_tx_bytes_per_s=0.0,
               nvlink_tx_bytes_per_s=0.0, nvlink_rx_bytes_per_s=0.0),
    gpu_sample(gpu=1, wall_ns=10 * 10**9, pcie_rx_bytes_per_s=1 * GB),  # sampled only before the load
]  # fmt: skip
IN_THE_LOAD = {
    "pcie_tx": {"mean": (1 + 1 + 4) / 3 * GB, "peak": 4 * GB},
    "pcie_rx": {"mean": (2 + 2 + 5) / 3 * GB, "peak": 5 * GB},
    "nvlink_tx": {"mean": (40 + 60 + 20) / 3 * GB, "peak": 60 * GB},
    "nvlink_rx": {"mean": (30 + 50 + 10) / 3 * GB, "peak": 50 * GB},
}


def request(number: int, arrival_s: int, end_s: int) -> RequestDone:
    tokens = (arrival_s * 10**9 + 10**8, end_s * 10**9)
    return RequestDone(
        rank=0,
        replica=0,
        request=number,
        arrival_ns=arrival_s * 10**9,
        first_token_ns=tokens[0],
        end_ns=end_s * 10**9,
        prompt_tokens=4,
        output_tokens=2,
        token_ns=tokens,
        output_ids=(1, 2),
        status="completed",
        error=None,
    )


def test_a_serving_runs_link_rates_are_over_the_loads_window_by_hand() -> None:
    """Requests from 20 s to 32 s and from 25 s to 40 s: the window is 20-40 s, so the weight load at 10 s
    (PCIe rx 20 GB/s) and the idle at 50 s count for none of the link figures; GPU 1, sampled only before,
    has none (unknown, not 0). Before any request completed, the figures are the run's."""
    fold = RunFold(description(mode="infer"))
    fold_events(fold, SERVED)
    before = fold.figures().gpus[0]
    assert before.links_over == "run"
    assert before.links["pcie_rx"] == {"mean": pytest.approx((20 + 2 + 2 + 5 + 0) / 5 * GB), "peak": 20 * GB}
    fold_events(fold, [request(0, 20, 32), request(1, 25, 40)])
    gpus = fold.figures().gpus
    assert [row.links_over for row in gpus] == ["load", "load"]
    assert gpus[0].links == {
        name: {"mean": pytest.approx(rate["mean"]), "peak": rate["peak"]} for name, rate in IN_THE_LOAD.items()
    }
    assert gpus[1].links == NO_LINKS
    assert gpus[0].samples == 5  # the other figures stay the run's


def test_a_training_runs_link_rates_are_over_the_run() -> None:
    fold = RunFold(description(dp=2))
    fold_events(fold, SERVED)
    row = fold.figures().gpus[0]
    assert row.links_over == "run"
    assert row.links["pcie_rx"] == {"mean": pytest.approx((20 + 2 + 2 + 5 + 0) / 5 * GB), "peak": 20 * GB}
    assert row.links["nvlink_tx"] == {"mean": pytest.approx((40 + 60 + 20 + 0) / 4 * GB), "peak": 60 * GB}


def served(directory: Path, nvlink_scale: float = 1.0) -> Recording:
    """A built-in serving run's recording: :data:`SERVED`'s samples (NVLink rates x ``nvlink_scale``), and
    requests over 20-40 s."""
    samples = [
        dataclasses.replace(
            sample,
            nvlink_tx_bytes_per_s=None
            if sample.nvlink_tx_bytes_per_s is None
            else sample.nvlink_tx_bytes_per_s * nvlink_scale,
        )
        for sample in SERVED
    ]
    events = [*samples, request(0, 20, 32), request(1, 25, 40)]
    return open_recording(write_recording(directory, events, run=description(mode="infer")))


def test_summary_gives_each_gpus_link_figures_beside_the_request_latencies(tmp_path: Path) -> None:
    summary = summarize(served(tmp_path / "a"))
    gpu = summary["gpus"][0]
    assert gpu["links_over"] == "load"
    assert gpu["links"]["nvlink_tx"] == {"mean": pytest.approx(40 * GB), "peak": 60 * GB}
    assert gpu["links"]["pcie_rx"] == {"mean": pytest.approx(3 * GB), "peak": 5 * GB}
    assert summary["gpus"][1]["links"] == NO_LINKS
    lines = summary_lines(summary)
    at = lines.index(next(line for line in lines if line.startswith("GPU 0 ")))
    assert at > lines.index(next(line for line in lines if "TTFT" in line))  # after the request latencies
    assert lines[at + 1] == (
        "  links over the load, mean/peak: PCIe tx 2.0G/4.0GB/s rx 3.0G/5.0GB/s, NVLink tx 40.0G/60.0GB/s "
        "rx 30.0G/50.0GB/s"
    )
    assert lines[at + 2].startswith("GPU 1 ")  # no rate read in the load: no links line


def test_compare_says_the_change_of_each_link_figure(tmp_path: Path) -> None:
    """B's NVLink tx doubled: its mean 40 -> 80 GB/s and its peak 60 -> 120 GB/s, ratio 2, significant (one value
    a run: past 2 %); PCIe the same, ratio 1; GPU 1 had no rate in either load: no rows."""
    compared = compare(served(tmp_path / "a"), served(tmp_path / "b", nvlink_scale=2.0))
    rows = {row["name"]: row for row in compared["metrics"] if "/s)" in row["name"] and "GPU" in row["name"]}
    assert rows["GPU 0 NVLink tx mean (bytes/s)"] == {
        "name": "GPU 0 NVLink tx mean (bytes/s)",
        "a": pytest.approx(40 * GB),
        "b": pytest.approx(80 * GB),
        "ratio": pytest.approx(2.0),
        "significant": True,
    }
    assert (rows["GPU 0 NVLink tx peak (bytes/s)"]["a"], rows["GPU 0 NVLink tx peak (bytes/s)"]["b"]) == (
        60 * GB,
        120 * GB,
    )
    assert rows["GPU 0 PCIe rx peak (bytes/s)"]["ratio"] == 1.0
    assert not rows["GPU 0 PCIe rx mean (bytes/s)"]["significant"]
    assert len(rows) == 8
    text = comparison_lines(compared)
    assert any(line.strip().startswith("GPU 0 NVLink tx mean (bytes/s)") for line in text)


def test_an_idle_link_reads_0_not_unknown() -> None:
    """Two samples of a GPU whose links carried nothing (every rate 0.0 B/s): mean (0 + 0) / 2 = 0 and peak 0,
    read twice, so known, unlike a rate never read (None)."""
    idle = {name: 0.0 for name in ("pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx")}
    fold = GpuFold()
    fold.add(
        table_of([gpu_sample(gpu=0, wall_ns=t, **{f"{n}_bytes_per_s": v for n, v in idle.items()}) for t in (1, 2)])
    )
    assert fold.rows()[0].links == {name: {"mean": 0.0, "peak": 0.0} for name in idle}


def test_the_loads_window_over_samples_that_came_in_several_tables() -> None:
    """SERVED's samples in two tables (10-20 s; 30-50 s): the window 20-40 s takes the three samples of the load
    from both, as from one table (IN_THE_LOAD). A fold that keeps no samples (a fleet's, the
    default) gives the run's figures whatever window is asked."""
    kept = GpuFold(keeps_samples=True)
    for part in (SERVED[:2], SERVED[2:]):
        kept.add(table_of(part))
    window = (20 * 10**9, 40 * 10**9)
    row = kept.rows(window)[0]
    assert row.links_over == "load"
    assert row.links == {
        name: {"mean": pytest.approx(rate["mean"]), "peak": rate["peak"]} for name, rate in IN_THE_LOAD.items()
    }
    assert kept.rows(window)[0].links == row.links  # asked again, after the tables were joined into one
    assert GpuFold(keeps_samples=True).rows(window) == []  # no sample yet: no GPU
    folded = GpuFold()
    folded.add(table_of(SERVED))
    assert folded.rows(window)[0].links_over == "run"
    assert folded.rows(window)[0].links["pcie_rx"] == {
        "mean": pytest.approx((20 + 2 + 2 + 5 + 0) / 5 * GB),
        "peak": 20 * GB,
    }
