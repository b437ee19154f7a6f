"""The C++ and the Python collective kernels report the same operations the same way, and the C++ one
is found, built and loaded as the launcher arranges (or its absence said in one line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from probes import native
from probes.errors import ProbeError


def run_kernel_worker(tmp_path: Path, native_env: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "tests.kernel_worker", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", native.NATIVE_ENV: native_env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]


@pytest.fixture
def reports(collective_kernel: tuple[str, str], tmp_path: Path) -> tuple[str, list[dict]]:
    kernel, native_env = collective_kernel
    return kernel, run_kernel_worker(tmp_path, native_env)


def shape(event: dict) -> tuple:
    return (event["op"], event["group"], event["group_size"], event["peer"], event["bytes"], event["dtype"],
            event["step"], event["clock"])


@pytest.mark.slow
def test_each_kernel_reports_every_operation_with_its_group_bytes_peer_and_step(
        reports: tuple[str, list[dict]]) -> None:
    kernel, ranks = reports
    for rank, report in enumerate(ranks):
        assert report["kernel"] == kernel
        assert report["errors"] == []
        peer = 1 - rank
        expected = [
            ("all_reduce", "tp", 2, None, 4000, "float32", 3, "completion"),
            ("all_reduce", "tp", 2, None, 512, "bfloat16", 3, "completion"),  # DTensor's functional path
            ("all_reduce", "tp", 2, None, 4000, "float32", 3, "completion"),
            ("send" if rank == 0 else "recv", "tp", 2, peer, 4000, "float32", 3, "completion"),
            ("reduce_scatter", "tp", 2, None, 4000, "float32", None, "completion"),
            ("broadcast", "tp", 2, None, 80, "int64", None, "completion"),
            ("barrier", "tp", 2, None, 0, None, None, "completion"),
        ]
        collectives = sorted(report["collectives"], key=lambda e: e["start_ns"])
        assert [shape(e) for e in collectives] == expected, f"rank {rank}"
        assert all(e["start_ns"] <= e["end_ns"] for e in collectives)
        if rank == 0:
            # Rank 1 joined the third all-reduce late: rank 0 waited that long for it to end.
            late = collectives[2]
            assert late["end_ns"] - late["start_ns"] > 0.2e9
            progress = report["progress"]
            assert progress["in_flight"] == 1
            assert (progress["oldest_op"], progress["oldest_group"]) == ("all_reduce", "tp")
            assert progress["oldest_start_ns"] == late["start_ns"]


def test_the_environment_says_which_kernel_and_why_there_is_no_cpp_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(native.NATIVE_ENV, "off")
    assert native.from_environment() == (None, None)
    monkeypatch.setenv(native.NATIVE_ENV, "unavailable: cannot build the C++ collective probe: no g++")
    assert native.from_environment() == (None, "cannot build the C++ collective probe: no g++")
    monkeypatch.delenv(native.NATIVE_ENV)
    assert native.from_environment() == (None, "the launcher did not build it")
    monkeypatch.setenv(native.NATIVE_ENV, str(tmp_path / "missing.so"))
    module, why = native.from_environment()
    assert module is None and why is not None and why.startswith("cannot load the C++ collective probe")


@pytest.mark.slow
def test_a_source_that_does_not_compile_is_one_line_and_no_module(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    broken = tmp_path / "c10d_kernel.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(native, "SOURCE", broken)
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(native.NATIVE_ENV, raising=False)
    with pytest.raises(ProbeError, match="^cannot build the C.. collective probe: ") as raised:
        native.build()
    assert "\n" not in str(raised.value)
    assert native.environment_value().startswith(native.UNAVAILABLE + "cannot build")
