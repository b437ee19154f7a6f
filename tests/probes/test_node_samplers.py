"""NVML (through a fake library, since this machine has no GPU), psutil and py-spy samplers."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from meshtop.probes.events import GpuLink, GpuSample, NvmlState, ProcessSample
from meshtop.probes.nvml import Nvml, visible_indices
from meshtop.probes.samplers import GpuSampler, ProcessSampler
from meshtop.probes.stacks import dump_stack, py_spy_executable


class FakeNvmlError(Exception):
    pass


class FakeLibraryNotFound(FakeNvmlError):
    pass


NOT_SUPPORTED = 3
"""NVML_ERROR_NOT_SUPPORTED: a field value's ``nvmlReturn`` where the GPU has no such counter."""
ALL_LINKS = 0xFFFFFFFF


def fake_pynvml(gpus: int = 2, *, init_error: Exception | None = None, nvlink_pairs: int = 0) -> SimpleNamespace:
    """A stand-in for the pynvml module at the one boundary this machine cannot reach, following NVML's API:
    PCIe throughput in KB/s; the NVLink data counters as field values 138 / 139 in KiB, each link's own
    (the field's scope is the link; pynvml sends scope 0 for a bare field id) or their sum for the scope
    ``UINT_MAX``, and ``NOT_SUPPORTED`` in the field of a link the GPU does not have (every link: no NVLink).
    Each reading moves every link on by 1024 KiB sent and 2048 KiB received."""
    readings = [0] * gpus

    def field_values(handle, fields):
        readings[handle] += 1
        values = []
        for field in fields:
            field_id, scope = field if isinstance(field, tuple) else (field, 0)
            per_link = {138: 1024, 139: 2048}[field_id] * readings[handle]
            links = nvlink_pairs if scope == ALL_LINKS else (1 if scope < nvlink_pairs else 0)
            values.append(
                SimpleNamespace(
                    fieldId=field_id,
                    scopeId=scope,
                    nvmlReturn=0 if links else NOT_SUPPORTED,
                    value=SimpleNamespace(ullVal=per_link * links),
                )
            )
        return values

    def not_supported(*args):
        raise FakeNvmlError("Not Supported")

    def init():
        if init_error is not None:
            raise init_error

    def nvlink_state(handle, link):
        return 1 if link < nvlink_pairs else 0

    return SimpleNamespace(
        NVMLError=FakeNvmlError,
        NVMLError_LibraryNotFound=FakeLibraryNotFound,
        NVML_CLOCK_SM=1,
        NVML_TEMPERATURE_GPU=0,
        NVML_PCIE_UTIL_TX_BYTES=0,
        NVML_PCIE_UTIL_RX_BYTES=1,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX=138,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX=139,
        NVML_NVLINK_MAX_LINKS=4,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: gpus,
        nvmlSystemGetDriverVersion=lambda: "580.1",
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"Fake H200",
        nvmlDeviceGetUUID=lambda h: f"GPU-0000000{h}-fake",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=(h + 1) * 2**30, total=141 * 2**30),
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=90, memory=40),
        nvmlDeviceGetPowerUsage=lambda h: 350_000,
        nvmlDeviceGetPowerManagementDefaultLimit=lambda h: 700_000,
        nvmlDeviceGetClockInfo=lambda h, clock: 1980,
        nvmlDeviceGetTemperature=not_supported,
        nvmlDeviceGetPcieThroughput=lambda h, which: 100 if which == 0 else 200,
        nvmlDeviceGetFieldValues=field_values,
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=f"0000:0{h}:00.0".encode()),
        nvmlDeviceGetNvLinkState=nvlink_state,
        nvmlDeviceGetNvLinkRemotePciInfo=lambda h, link: SimpleNamespace(busId=f"0000:0{1 - h}:00.0".encode()),
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 30,
    )


def test_gpu_readings_with_unsupported_fields_as_none() -> None:
    nvml = Nvml(fake_pynvml())
    assert nvml.state == "ok" and len(nvml.handles) == 2
    sample = nvml.sample(1)
    assert isinstance(sample, GpuSample)
    assert (sample.name, sample.memory_used_bytes, sample.memory_total_bytes) == ("Fake H200", 2 * 2**30, 141 * 2**30)
    assert sample.uuid == "GPU-00000001-fake"  # the DCGM exporter's UUID label
    assert (sample.utilization_pct, sample.power_w, sample.sm_clock_mhz) == (90.0, 350.0, 1980.0)
    assert sample.power_limit_w == 700.0  # an SXM module's: what tells it from an NVL card for MFU's peak
    assert sample.temperature_c is None  # "Not Supported" is a missing value, not an error
    assert (sample.pcie_tx_bytes_per_s, sample.pcie_rx_bytes_per_s) == (100 * 1024, 200 * 1024)
    assert sample.nvlink_tx_bytes_per_s is None  # no NVLink: NVML's field says NOT_SUPPORTED
    second = nvml.sample(1)
    assert (second.nvlink_tx_bytes_per_s, second.nvlink_rx_bytes_per_s) == (None, None)  # unknown, never 0


def test_nvlink_rates_are_every_links_kib_counters_over_the_time_between_two_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two links, each sending 1024 KiB and receiving 2048 KiB between two samples 0.5 s apart: tx = 2 x 1024 x
    1024 B / 0.5 s = 4 MiB/s, rx 8 MiB/s (the scope of every link: link 0's alone would be half). A counter
    that went down (a reset) gives no rate, not a negative one; one that stood still, 0."""
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    nv = fake_pynvml(nvlink_pairs=2)
    nvml = Nvml(nv)
    assert nvml.sample(0).nvlink_tx_bytes_per_s is None  # a rate needs two readings
    clock[0] += 0.5
    second = nvml.sample(0)
    assert (second.nvlink_tx_bytes_per_s, second.nvlink_rx_bytes_per_s) == (4 * 2**20, 8 * 2**20)
    nv.nvmlDeviceGetFieldValues = lambda handle, fields: [
        SimpleNamespace(fieldId=f, scopeId=scope, nvmlReturn=0, value=SimpleNamespace(ullVal=0)) for f, scope in fields
    ]
    clock[0] += 0.5
    reset = nvml.sample(0)
    assert (reset.nvlink_tx_bytes_per_s, reset.nvlink_rx_bytes_per_s) == (None, None)
    clock[0] += 0.5
    idle = nvml.sample(0)
    assert (idle.nvlink_tx_bytes_per_s, idle.nvlink_rx_bytes_per_s) == (0.0, 0.0)  # known idle: 0


def test_pcie_is_read_once_a_period_for_one_gpu_a_sample_and_repeated_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """nvmlDeviceGetPcieThroughput takes 21 ms of wall and 0.85 ms of CPU a call on an H200: each GPU's is read
    once a period, one GPU a sample (the one read longest ago), and the samples between repeat its last rates."""
    nv = fake_pynvml(gpus=3)
    reads: list[int] = []
    rates = {0: 100, 1: 200}

    def throughput(handle: int, which: int) -> int:
        reads.append(handle)
        return rates[which] * (handle + 1)

    nv.nvmlDeviceGetPcieThroughput = throughput
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    nvml = Nvml(nv)
    read_by_sample = []
    for _ in range(8):  # 8 samples 0.4 s apart: 3.2 s
        before = len(reads)
        samples = nvml.samples()
        read_by_sample.append(sorted(set(reads[before:])))
        clock[0] += 0.4
        assert [s.gpu for s in samples] == [0, 1, 2]
    # one GPU a sample at most (two calls: tx, rx), every GPU in turn, each again only once a period has passed
    assert read_by_sample == [[0], [1], [2], [0], [1], [2], [0], [1]]
    assert len(reads) == 16
    nvml.samples()  # GPU 2's, read 1.2 s ago
    last = nvml.samples()  # at once: nothing due (GPU 0 read 0.8 s ago), every GPU's last reading
    assert len(reads) == 18
    assert [(s.pcie_tx_bytes_per_s, s.pcie_rx_bytes_per_s) for s in last] == [
        (100 * 1024 * (gpu + 1), 200 * 1024 * (gpu + 1)) for gpu in range(3)
    ]
    assert Nvml(nv).sample(1, read_pcie=False).pcie_tx_bytes_per_s is None  # none read yet


def test_gpus_behind_an_nvswitch_are_nvlink_peers() -> None:
    """On an HGX board every NVLink ends at a switch, so no link's far end is a GPU: P2P status says it."""
    nv = fake_pynvml(nvlink_pairs=2)
    nv.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: SimpleNamespace(busId=b"0000:ff:00.0")  # the switch
    nv.NVML_P2P_CAPS_INDEX_NVLINK, nv.NVML_P2P_STATUS_OK = 3, 0
    nv.nvmlDeviceGetP2PStatus = lambda a, b, index: 0 if index == 3 else 1
    assert Nvml(nv).topology() == [GpuLink(gpu_a=0, gpu_b=1, path="NVLink", nvlinks=None)]
    nv.nvmlDeviceGetP2PStatus = lambda a, b, index: 4  # not supported: the PCIe path, as before
    assert Nvml(nv).topology()[0].path == "PCIe host bridge"


def test_topology_names_nvlink_or_the_pcie_path() -> None:
    assert Nvml(fake_pynvml(nvlink_pairs=2)).topology() == [GpuLink(gpu_a=0, gpu_b=1, path="NVLink", nvlinks=2)]
    assert Nvml(fake_pynvml(nvlink_pairs=0)).topology() == [
        GpuLink(gpu_a=0, gpu_b=1, path="PCIe host bridge", nvlinks=0)
    ]


@pytest.mark.parametrize(
    ("nvml", "state"),
    [
        (lambda: Nvml(None), "no_library"),
        (lambda: Nvml(fake_pynvml(init_error=FakeLibraryNotFound("NVML Shared Library Not Found"))), "no_library"),
        (lambda: Nvml(fake_pynvml(gpus=0)), "no_gpu"),
        (lambda: Nvml(fake_pynvml(init_error=FakeNvmlError("Driver Not Loaded"))), "error"),
    ],
)
def test_no_nvml_or_no_gpu_is_a_state_not_an_error(nvml, state: str) -> None:
    opened = nvml()
    assert opened.state == state
    event = opened.state_event()
    assert isinstance(event, NvmlState) and event.state == state and event.detail


def test_real_nvml_here_reports_the_state_this_machine_is_in() -> None:
    """NVML as it is here, against what the machine says without NVML's Python binding: a driver library that
    does not load is ``no_library``; one that loads sees the GPUs that ``nvidia-smi -L`` lists (``no_gpu``
    for none)."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        nvml = Nvml()
        assert (nvml.state, nvml.handles) == ("no_library", [])
        assert nvml.detail is not None and "Not Found" in nvml.detail
        return
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("libnvidia-ml loads but nvidia-smi is not installed: no count of the GPUs but NVML's own")
    listed = [
        line
        for line in subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60).stdout.splitlines()
        if line.startswith("GPU ")
    ]
    visible = visible_indices(len(listed))
    nvml = Nvml()
    assert nvml.state == ("ok" if visible else "no_gpu") and len(nvml.handles) == len(visible)


def test_cuda_visible_devices_selects_and_orders_gpus() -> None:
    assert visible_indices(4, {}) == [0, 1, 2, 3]
    assert visible_indices(4, {"CUDA_VISIBLE_DEVICES": "2,0"}) == [2, 0]
    assert visible_indices(4, {"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_indices(4, {"CUDA_VISIBLE_DEVICES": "1,7,2"}) == [1]


def test_gpu_sampler_announces_state_and_topology_then_samples_at_its_rate() -> None:
    """Fifteen ticks are awaited, not a time slept: a loaded machine delays ticks, and the sampler does not make
    up for late ones. Its rate is held to where load cannot help it: a tick is never early, so the i-th batch
    comes no sooner than i periods after the start (not a bound between two batches: one after a late tick
    comes at once)."""
    batches: list[tuple[float, list]] = []
    sampler = GpuSampler(
        rate_hz=50, emit=lambda batch: batches.append((time.monotonic(), batch)), nvml=Nvml(fake_pynvml(nvlink_pairs=1))
    )
    started = time.monotonic()
    sampler.start()
    deadline = started + 10.0
    while len(batches) < 15 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    events = [e for _, batch in batches for e in batch]
    assert isinstance(events[0], NvmlState) and isinstance(events[1], GpuLink)
    assert len(batches) >= 15
    assert all(sum(isinstance(e, GpuSample) for e in batch) == 2 for _, batch in batches)  # two GPUs a tick
    too_soon = [(i, round(at - started, 4)) for i, (at, _) in enumerate(batches) if at - started < 0.9 * i / 50]
    assert not too_soon  # 50 Hz at most
    assert sum(isinstance(e, NvmlState) for e in events) == 1


def test_process_sampler_reads_cpu_rss_and_threads_of_each_rank() -> None:
    """Five samples are awaited, not a time slept, and the CPU they saw is held to what the busy child really used
    meanwhile (its own CPU times), not to a share of a core: on a loaded machine it gets what the others leave it.
    The most any reading after the first saw is taken: the first covers only the moment from ``watch`` to the
    first tick, and one right after a late tick (not made up for) next to no time, so a single reading of a busy
    child may well be 0 %. A sampler that never measured the CPU, or not in percent of a core, still fails."""
    busy = "x = bytearray(50_000_000)\nprint('allocated', flush=True)\nwhile True: pass"
    child = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "allocated\n"  # started, on a loaded machine
        batches: list[list] = []
        sampler = ProcessSampler(rate_hz=10, emit=batches.append)
        process = psutil.Process(child.pid)
        used_before, since = sum(process.cpu_times()[:2]), time.monotonic()
        sampler.watch(3, child.pid)
        sampler.start()
        deadline = since + 10.0
        while sum(map(len, batches)) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        sampler.stop()
        used_pct = 100 * (sum(process.cpu_times()[:2]) - used_before) / (time.monotonic() - since)
    finally:
        child.kill()
        child.wait()
    samples = [e for batch in batches for e in batch if isinstance(e, ProcessSample)]
    assert len(samples) >= 5
    assert all(s.rank == 3 and s.pid == child.pid for s in samples)
    assert samples[-1].rss_bytes > 50_000_000
    assert used_pct > 5  # a busy loop, that ran meanwhile
    assert max(s.cpu_pct for s in samples[1:]) >= used_pct / 2
    assert samples[-1].threads >= 1


def test_py_spy_dumps_a_running_python_process_or_says_why_not() -> None:
    """The child says when it is inside ``waiting_here``: the dump is taken then, not after a time slept."""
    waits = "import time\ndef waiting_here():\n    print('waiting', flush=True)\n    time.sleep(60)\nwaiting_here()"
    child = subprocess.Popen([sys.executable, "-c", waits], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "waiting\n"
        dump = dump_stack(0, child.pid)
    finally:
        child.kill()
        child.wait()
    assert py_spy_executable() is not None
    if dump.error is None:
        assert "waiting_here" in dump.text
    else:  # containers without ptrace: the message must say so plainly
        assert "ptrace" in dump.error


def test_py_spy_that_cannot_run_is_a_clear_message() -> None:
    missing = dump_stack(0, os.getpid(), executable="/nonexistent/py-spy")
    assert missing.text is None
    assert missing.error == "cannot run py-spy (/nonexistent/py-spy): No such file or directory"
