"""Shared fixtures."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from meshtop.probes import native
from tests.kit.commands import run_meshtop
from tests.kit.jobs import launch
from tests.kit.terminal import terminal  # noqa: F401  (the real-terminal tests' fixture)

SCHEDULER_VARIABLE = re.compile(r"^(PET_.*|MASTER_ADDR|MASTER_PORT|SLURM_.*)$")


@pytest.fixture
def launch_cpu(tmp_path: Path):
    return lambda **spec: launch(tmp_path, **spec)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Build the C++ collective probe before any test runs, so no job's hang timeout waits on the compiler.

    And let the commands the tests start take SIGINT (ctrl-c, q): a shell without job control starts a
    command it puts in the background with SIGINT ignored, and a child inherits that, so under such a shell
    every test that interrupts meshtop waited on a meshtop that never heard it.

    And leave out a scheduler's node variables (meshtop.runner.multinode.scheduler), which would place every
    job the tests start on many nodes; a test gives them where it means them."""
    native.environment_value()
    for name in [name for name in os.environ if SCHEDULER_VARIABLE.match(name)]:
        del os.environ[name]  # a test run under srun or in a pod: each job a test starts runs on this machine alone
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a handler: children start with the default


@pytest.fixture(scope="session")
def native_probe() -> Path:
    """The C++ collective probe, built once (the tests need a C++ compiler, as torch's extensions do)."""
    return native.build()


@pytest.fixture(params=["cpp", "python"])
def collective_kernel(request: pytest.FixtureRequest) -> tuple[str, str]:
    """Each collective kernel: its name and the ``MESHTOP_NATIVE_PROBE`` value that selects it for a rank."""
    if request.param == "cpp":
        return "cpp", str(request.getfixturevalue("native_probe"))
    return "python", "off"


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real recording: dp2 x pp2 on CPU, 4 steps (shared by the recording tests)."""
    out = tmp_path_factory.mktemp("rec") / "pp2"
    done = run_meshtop("record", str(out), "--dp", "2", "--pp", "2", "--steps", "4", "--device", "cpu", timeout_s=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out
