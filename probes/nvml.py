"""The one door to NVML: every call goes through :class:`Nvml`, which turns an error into ``None``.

No NVML library, or a machine with no GPU, is a state (:attr:`Nvml.state`),
never an exception; the samplers report it and the screen draws it.

The link rates of a :class:`~meshtop.probes.events.GpuSample`, in bytes/s, and what NVML gives for them:

- PCIe tx / rx: ``nvmlDeviceGetPcieThroughput(handle, NVML_PCIE_UTIL_TX_BYTES / _RX_BYTES)``, a rate in KB/s
  that NVML measures over a 20 ms window inside the call; its KB taken as :data:`KIB` bytes, the unit of
  NVML's other byte counters;
- NVLink tx / rx: the field values ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX`` (ids 138 / 139), cumulative
  counts of data bytes in KiB (protocol overhead left out: the ``_RAW_`` fields hold it), asked for with the
  scope :data:`ALL_LINKS`, NVML's sum over every link (a field's scope is its link; pynvml sends scope 0, link
  0 alone, for a bare field id). The rate is the difference of two samples' counts over the time between;
- a GPU that does not have one (no NVLink: each field comes back ``NVML_ERROR_NOT_SUPPORTED``; PCIe
  throughput not supported, a vGPU), the first NVLink sample (a rate needs two readings) and a count that went
  down (a reset): ``None``, never 0.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from meshtop.probes.events import GpuLink, GpuSample, NvmlState

T = TypeVar("T")
KIB = 1024
ALL_LINKS = 0xFFFFFFFF
"""The field scope (``UINT_MAX``) for which NVML sums an NVLink counter over every link of the GPU."""
PCIE_PERIOD_S = 1.0
"""How often a GPU's PCIe rate is read. ``nvmlDeviceGetPcieThroughput`` watches the bus for 20 ms inside the
call, and its two calls (tx, rx) cost more CPU than every other reading of a sample together (docs/benchmarks.md,
"What each NVML call costs"). So the rate is read once a second a GPU, for one GPU a sample at most (the one
read longest ago), and the samples between repeat that GPU's last reading."""
PATHS = {  # nvmlGpuTopologyLevel_t -> how the two GPUs reach each other over PCIe
    0: "same board",
    10: "PCIe switch",
    20: "PCIe switches",
    30: "PCIe host bridge",
    40: "CPU (same NUMA node)",
    50: "system (across CPUs)",
}


def load_pynvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def visible_indices(count: int, environ: dict[str, str] | None = None) -> list[int]:
    """NVML indices of the GPUs the job sees, in CUDA order (CUDA_VISIBLE_DEVICES of integers)."""
    visible = (environ if environ is not None else os.environ).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    indices = []
    for item in visible.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) >= count:
            break  # CUDA stops at the first invalid entry too (UUIDs: not mapped here)
        indices.append(int(item))
    return indices


class Nvml:
    """NVML, opened once; :attr:`state` says whether it works."""

    def __init__(self, library: ModuleType | Callable[[], ModuleType | None] | None = load_pynvml) -> None:
        self.nv = library() if callable(library) else library
        self.state, self.detail, self.driver_version = "ok", None, None
        self.handles: list[Any] = []
        self._nvlink_last: dict[int, tuple[float, int | None, int | None]] = {}
        self._uuids: dict[int, str | None] = {}
        self._names: dict[int, str | None] = {}
        self._power_limits: dict[int, float | None] = {}
        self._pcie: dict[int, tuple[float, float | None, float | None]] = {}
        """GPU -> when its PCIe rate was last read (monotonic), and the tx and rx rates read then."""
        if self.nv is None:
            self.state, self.detail = "no_library", "the nvidia-ml-py package is not installed"
            return
        try:
            self.nv.nvmlInit()
        except self.nv.NVMLError as error:
            library_missing = isinstance(error, getattr(self.nv, "NVMLError_LibraryNotFound", ()))
            self.state = "no_library" if library_missing else "error"
            self.detail = str(error)
            return
        count = self.call(self.nv.nvmlDeviceGetCount) or 0
        self.handles = [self.call(self.nv.nvmlDeviceGetHandleByIndex, i) for i in visible_indices(count)]
        self.driver_version = self.call(self.nv.nvmlSystemGetDriverVersion)
        if not self.handles:
            self.state, self.detail = "no_gpu", "NVML sees no GPU"

    def call(self, function: Callable[..., T], *args: Any) -> T | None:
        """``function(*args)``, or ``None`` if NVML refuses (not supported, no permission, GPU lost...)."""
        try:
            return function(*args)
        except self.nv.NVMLError:  # type: ignore[union-attr]
            return None

    def state_event(self) -> NvmlState:
        return NvmlState(
            wall_ns=time.time_ns(),
            state=self.state,
            gpu_count=len(self.handles),
            detail=self.detail,
            driver_version=_text(self.driver_version),
        )

    def samples(self) -> list[GpuSample]:
        """A sample of every GPU, the PCIe rate read anew for one of them at most (:data:`PCIE_PERIOD_S`)."""
        due = self._pcie_due()
        return [self.sample(gpu, read_pcie=gpu == due) for gpu in range(len(self.handles))]

    def _pcie_due(self) -> int | None:
        """The GPU whose PCIe rate was read longest ago (never: first), if that was a period ago or more."""
        if not self.handles:
            return None

        def last_read(gpu: int) -> float:
            return self._pcie[gpu][0] if gpu in self._pcie else -math.inf

        oldest = min(range(len(self.handles)), key=last_read)
        return oldest if time.monotonic() - last_read(oldest) >= PCIE_PERIOD_S else None

    def sample(self, gpu: int, *, read_pcie: bool = True) -> GpuSample:
        """GPU ``gpu``'s readings now; its PCIe rate read anew with ``read_pcie``, else its last reading."""
        nv, handle = self.nv, self.handles[gpu]
        assert nv is not None
        memory = self.call(nv.nvmlDeviceGetMemoryInfo, handle)
        rates = self.call(nv.nvmlDeviceGetUtilizationRates, handle)
        power_mw = self.call(nv.nvmlDeviceGetPowerUsage, handle)
        tx, rx = self._pcie_rates(gpu) if read_pcie else self._pcie.get(gpu, (0.0, None, None))[1:]
        nvlink_tx, nvlink_rx = self._nvlink_rates(gpu)
        return GpuSample(
            gpu=gpu,
            wall_ns=time.time_ns(),
            name=self._name(gpu),
            memory_used_bytes=memory.used if memory is not None else None,
            memory_total_bytes=memory.total if memory is not None else None,
            utilization_pct=float(rates.gpu) if rates is not None else None,
            memory_utilization_pct=float(rates.memory) if rates is not None else None,
            power_w=power_mw / 1000 if power_mw is not None else None,
            sm_clock_mhz=_float(self.call(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM)),
            temperature_c=_float(self.call(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)),
            pcie_tx_bytes_per_s=tx,
            pcie_rx_bytes_per_s=rx,
            nvlink_tx_bytes_per_s=nvlink_tx,
            nvlink_rx_bytes_per_s=nvlink_rx,
            uuid=self._uuid(gpu),
            power_limit_w=self._power_limit_w(gpu),
        )

    def _power_limit_w(self, gpu: int) -> float | None:
        """The GPU's default power limit in W, read once (a board property)."""
        if gpu not in self._power_limits:
            assert self.nv is not None
            limit_mw = self.call(self.nv.nvmlDeviceGetPowerManagementDefaultLimit, self.handles[gpu])
            self._power_limits[gpu] = limit_mw / 1000 if isinstance(limit_mw, int | float) else None
        return self._power_limits[gpu]

    def _pcie_rates(self, gpu: int) -> tuple[float | None, float | None]:
        """GPU ``gpu``'s PCIe tx and rx in bytes/s (NVML's KB/s x :data:`KIB`) over NVML's 20 ms window, read now
        and kept."""
        nv, handle = self.nv, self.handles[gpu]
        assert nv is not None
        tx = self.call(nv.nvmlDeviceGetPcieThroughput, handle, nv.NVML_PCIE_UTIL_TX_BYTES)
        rx = self.call(nv.nvmlDeviceGetPcieThroughput, handle, nv.NVML_PCIE_UTIL_RX_BYTES)
        rates = (tx * KIB if tx is not None else None, rx * KIB if rx is not None else None)
        self._pcie[gpu] = (time.monotonic(), *rates)
        return rates

    def _name(self, gpu: int) -> str | None:
        """The GPU's product name, read once."""
        if gpu not in self._names:
            assert self.nv is not None
            self._names[gpu] = _text(self.call(self.nv.nvmlDeviceGetName, self.handles[gpu]))
        return self._names[gpu]

    def _uuid(self, gpu: int) -> str | None:
        """The GPU's UUID, read once (it never changes)."""
        if gpu not in self._uuids:
            assert self.nv is not None
            self._uuids[gpu] = _text(self.call(self.nv.nvmlDeviceGetUUID, self.handles[gpu]))
        return self._uuids[gpu]

    def _nvlink_rates(self, gpu: int) -> tuple[float | None, float | None]:
        """NVLink data throughput over every link, from the cumulative KiB counters; ``None`` without NVLink."""
        nv = self.nv
        assert nv is not None
        fields = self.call(
            nv.nvmlDeviceGetFieldValues,
            self.handles[gpu],
            [
                (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
                (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS),
            ],
        )
        now = time.monotonic()
        counters = [_field_value(f) for f in fields] if fields else [None, None]
        previous = self._nvlink_last.get(gpu)
        self._nvlink_last[gpu] = (now, counters[0], counters[1])
        if previous is None:
            return None, None
        when, tx_before, rx_before = previous
        tx, rx = counters
        if tx is None or rx is None or tx_before is None or rx_before is None or now <= when:
            return None, None
        if tx < tx_before or rx < rx_before:  # the counters were reset: no rate this sample
            return None, None
        return (tx - tx_before) * KIB / (now - when), (rx - rx_before) * KIB / (now - when)

    def topology(self) -> list[GpuLink]:
        """How each pair of visible GPUs is connected: NVLink (with the link count) or the PCIe path."""
        nv = self.nv
        if nv is None or len(self.handles) < 2:
            return []
        bus_ids = [_text(getattr(self.call(nv.nvmlDeviceGetPciInfo, h), "busId", None)) for h in self.handles]
        nvlinks: dict[tuple[int, int], int] = {}
        for a, handle in enumerate(self.handles):
            for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 0)):
                if self.call(nv.nvmlDeviceGetNvLinkState, handle, link) != 1:
                    continue
                remote = _text(getattr(self.call(nv.nvmlDeviceGetNvLinkRemotePciInfo, handle, link), "busId", None))
                if remote in bus_ids:
                    b = bus_ids.index(remote)
                    nvlinks[(a, b)] = nvlinks.get((a, b), 0) + 1
        links = []
        for a in range(len(self.handles)):
            for b in range(a + 1, len(self.handles)):
                count = nvlinks.get((a, b), 0)
                if count:
                    links.append(GpuLink(gpu_a=a, gpu_b=b, path="NVLink", nvlinks=count))
                    continue
                if self._nvlink_peers(a, b):  # through an NVSwitch: each link's far end is the switch, not b
                    links.append(GpuLink(gpu_a=a, gpu_b=b, path="NVLink", nvlinks=None))
                    continue
                level = self.call(nv.nvmlDeviceGetTopologyCommonAncestor, self.handles[a], self.handles[b])
                links.append(
                    GpuLink(
                        gpu_a=a,
                        gpu_b=b,
                        path=PATHS.get(level, "unknown") if level is not None else "unknown",
                        nvlinks=0,
                    )
                )
        return links

    def _nvlink_peers(self, a: int, b: int) -> bool:
        """Whether NVML says GPUs ``a`` and ``b`` reach each other over NVLink (directly or switched)."""
        nv = self.nv
        index = getattr(nv, "NVML_P2P_CAPS_INDEX_NVLINK", None)
        if nv is None or index is None or not hasattr(nv, "nvmlDeviceGetP2PStatus"):
            return False
        status = self.call(nv.nvmlDeviceGetP2PStatus, self.handles[a], self.handles[b], index)
        return status is not None and status == getattr(nv, "NVML_P2P_STATUS_OK", 0)

    def close(self) -> None:
        if self.nv is not None and self.state != "no_library" and self.state != "error":
            self.call(self.nv.nvmlShutdown)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _float(value: Any) -> float | None:
    return float(value) if value is not None else None


def _field_value(field: Any) -> int | None:
    if getattr(field, "nvmlReturn", 1) != 0:
        return None
    return int(field.value.ullVal)
