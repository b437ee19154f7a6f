"""What each NVML query the GPU sampler makes costs on a real GPU: ``python -m tests.bench.nvml_calls``.

The sampler reads each GPU with a handful of NVML calls at 10 Hz (:mod:`meshtop.probes.nvml`); its CPU share is
their sum. This times each call on GPU 0, ``--reps`` times in a row: the calling thread's CPU time and the wall
time of one call (median and max), so the expensive ones are named, not guessed. Needs a GPU (NVML).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from meshtop.probes.nvml import ALL_LINKS


def queries(nv: Any, handle: Any) -> dict[str, Callable[[], Any]]:
    """The sampler's calls (and the cumulative PCIe counters, a cheaper source of the same rate)."""
    return {
        "GetMemoryInfo": lambda: nv.nvmlDeviceGetMemoryInfo(handle),
        "GetUtilizationRates": lambda: nv.nvmlDeviceGetUtilizationRates(handle),
        "GetPowerUsage": lambda: nv.nvmlDeviceGetPowerUsage(handle),
        "GetPcieThroughput TX": lambda: nv.nvmlDeviceGetPcieThroughput(handle, nv.NVML_PCIE_UTIL_TX_BYTES),
        "GetPcieThroughput RX": lambda: nv.nvmlDeviceGetPcieThroughput(handle, nv.NVML_PCIE_UTIL_RX_BYTES),
        "GetFieldValues NVLink TX+RX": lambda: nv.nvmlDeviceGetFieldValues(
            handle,
            [
                (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
                (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS),
            ],
        ),
        "GetFieldValues PCIe count TX+RX": lambda: nv.nvmlDeviceGetFieldValues(
            handle, [nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
        ),
        "GetName": lambda: nv.nvmlDeviceGetName(handle),
        "GetClockInfo SM": lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
        "GetTemperature": lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=100)
    args = parser.parse_args()
    import pynvml as nv

    nv.nvmlInit()
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    print(f"{'call':34} {'CPU us p50':>11} {'CPU us max':>11} {'wall us p50':>12} {'wall us max':>12}  result")
    total_cpu = 0.0
    for name, call in queries(nv, handle).items():
        cpu, wall, result = [], [], None
        for _ in range(args.reps):
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            try:
                result = call()
            except nv.NVMLError as error:
                result = f"error: {error}"
            cpu.append((time.thread_time_ns() - c0) / 1e3)
            wall.append((time.perf_counter_ns() - w0) / 1e3)
        total_cpu += statistics.median(cpu)
        shown = str(result)[:60].replace("\n", " ")
        print(
            f"{name:34} {statistics.median(cpu):11.1f} {max(cpu):11.1f} {statistics.median(wall):12.1f} "
            f"{max(wall):12.1f}  {shown}"
        )
    print(f"sum of the CPU medians: {total_cpu:.0f} us a sample of every call")
    nv.nvmlShutdown()


if __name__ == "__main__":
    main()
