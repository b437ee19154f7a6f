"""Each GPU's figures from its NVML samples, by hand: the peak of the whole device's memory used, the mean
utilisation over the samples that read it; the same whether the samples come as events or as a table."""

from __future__ import annotations

import pytest

from meshtop.recordings.metrics.gpus import GpuFold, GpuRow, first_sample_of_each_gpu
from meshtop.recordings.schema import table_of
from tests.kit.events import gpu_sample

GIB = 1 << 30
SAMPLES = [
    gpu_sample(gpu=0, wall_ns=1, name="NVIDIA H200", memory_used_bytes=70 * GIB, memory_total_bytes=141 * GIB,
               utilization_pct=40.0),
    gpu_sample(gpu=0, wall_ns=2, name="NVIDIA H200", memory_used_bytes=120 * GIB, memory_total_bytes=141 * GIB,
               utilization_pct=None),  # the reading failed: no utilisation this sample
    gpu_sample(gpu=0, wall_ns=3, name="NVIDIA H200", memory_used_bytes=90 * GIB, memory_total_bytes=141 * GIB,
               utilization_pct=80.0),
    gpu_sample(gpu=1, wall_ns=1, node=1, name=None, memory_used_bytes=None, utilization_pct=10.0),
]  # fmt: skip
EXPECTED = [
    GpuRow(node=0, gpu=0, name="NVIDIA H200", samples=3, peak_used_bytes=120 * GIB, total_bytes=141 * GIB,
           utilization_mean_pct=60.0),
    GpuRow(node=1, gpu=1, name=None, samples=1, peak_used_bytes=None, total_bytes=None, utilization_mean_pct=10.0),
]  # fmt: skip


def test_each_gpu_peak_and_mean_utilisation_by_hand() -> None:
    fold = GpuFold()
    fold.add(table_of(SAMPLES))
    assert fold.rows() == EXPECTED
    assert GpuFold().rows() == []
    assert EXPECTED[0].utilization_mean_pct == pytest.approx((40 + 80) / 2)
    assert EXPECTED[0].utilization_mean_pct == pytest.approx((40 + 80) / 2)


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
