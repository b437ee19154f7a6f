"""Why a launcher or a rank died before it said so: the last meaningful line of the launcher's log.

The unit tests read logs written out here by hand; the job tests launch real jobs that fail before they
report (a launcher whose ``import torch`` fails, a rank that prints why and exits) and check the one line
the result carries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from meshtop.runner.job.agent import error_line
from meshtop.runner.job.environment import Launch
from meshtop.runner.job.last_words import MAX_CHARS, TAIL_BYTES, last_words, read_tail
from meshtop.runner.job.launch import run_job

TRACEBACK = """\
W1202 03:14:52.588000 11235 torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable
W1202 03:14:52.588000 11235 torch/distributed/run.py:793] *****************************************
Traceback (most recent call last):
  File "/work/job/train.py", line 3, in <module>
    import helpers
  File "/work/job/helpers.py", line 12, in <module>
    from apex import amp
ModuleNotFoundError: No module named 'apex'
E1202 03:14:52.621000 11235 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)
"""


def test_an_exception_is_said_with_its_last_frame_past_torchruns_log_lines() -> None:
    assert last_words(TRACEBACK) == "ModuleNotFoundError: No module named 'apex' (at /work/job/helpers.py:12)"


def test_a_rank_s_lines_prefixed_by_torchrun_tee_are_read_as_the_rank_wrote_them() -> None:
    """``torchrun --tee 3`` puts ``[default0]:`` before each line of rank 0's: the frames stay frames."""
    teed = "".join(line if line.startswith(("W", "E")) else f"[default0]:{line}" for line in TRACEBACK.splitlines(True))
    assert last_words(teed) == "ModuleNotFoundError: No module named 'apex' (at /work/job/helpers.py:12)"


def test_a_printed_line_is_said_as_printed() -> None:
    log = "step 0 loss 2.31\ncannot find the dataset at /data/x\n\n"
    assert last_words(log) == "cannot find the dataset at /data/x"


def test_a_peers_error_after_the_cause_is_passed_over() -> None:
    """The rank that failed first said why; its peer's traceback (gloo's connection closed) came later."""
    log = (
        "cannot find the dataset at /data/x\n"
        "Traceback (most recent call last):\n"
        '  File "/work/job/train.py", line 30, in <module>\n'
        "    dist.all_reduce(t)\n"
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [::1]:2\n"
    )
    assert last_words(log) == "cannot find the dataset at /data/x"


def test_a_chained_traceback_says_its_last_exception() -> None:
    log = textwrap.dedent("""\
        Traceback (most recent call last):
          File "/a.py", line 1, in <module>
        KeyError: 'x'

        The above exception was the direct cause of the following exception:

        Traceback (most recent call last):
          File "/a.py", line 4, in <module>
            raise ValueError("no x") from error
        ValueError: no x
        """)
    assert last_words(log) == "ValueError: no x (at /a.py:4)"


def test_only_torchruns_lines_or_nothing() -> None:
    only_torchrun = "E1202 03:14:52.621000 11235 torch/distributed/run.py:9] rendezvous timed out\n"
    assert last_words(only_torchrun) == only_torchrun.strip()
    assert last_words("\n  \n") is None
    assert last_words("") is None


def test_a_long_line_is_cut_and_keeps_where() -> None:
    line = "E" * 500
    said = last_words(f'Traceback (most recent call last):\n  File "/b.py", line 7, in f\n{line}\n')
    assert said is not None and len(said) == MAX_CHARS
    assert said.endswith("... (at /b.py:7)") and said.startswith("EEE")


def test_the_tail_is_bounded_starts_at_a_whole_line_and_leaves_out_earlier_launches(tmp_path: Path) -> None:
    log = tmp_path / "launcher.log"
    earlier = b"an earlier launch's last line\n"
    log.write_bytes(earlier)
    assert read_tail(log, start=len(earlier)) == ""
    body = b"".join(b"line %05d\n" % n for n in range(2000))  # 11 bytes a line, 22,000 bytes
    with log.open("ab") as file:
        file.write(body)
    tail = read_tail(log, start=len(earlier))
    assert len(tail.encode()) <= TAIL_BYTES and tail.endswith("line 01999\n")
    assert tail.startswith("line ") and len(tail.splitlines()[0]) == len("line 01999")
    assert read_tail(log, start=0, size=100_000).startswith("an earlier launch")
    assert read_tail(tmp_path / "missing.log") == ""


def test_torchruns_pointer_to_its_docs_is_no_error_of_the_rank() -> None:
    """A rank that wrote no error file gets torchrun's pointer to its docs as its message: the agent says none
    (the log is read instead), and keeps a real error's first line."""
    pointer = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
    assert error_line(pointer) is None and error_line({"message": pointer}) is None
    assert error_line({"message": "ValueError: bad batch\n  more"}) == "ValueError: bad batch"


@pytest.mark.slow
def test_a_launcher_that_fails_to_import_says_why(tmp_path: Path) -> None:
    """A ``torch`` on the launcher's path that raises: the launcher dies before it writes its status, and
    every rank's line says the launcher's exit code and its ImportError, where it was raised."""
    broken = tmp_path / "shadow" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("this torch is broken on purpose")\n')
    launch = Launch(
        launcher_args=("--standalone", "--nproc-per-node=2", "-m", "json.tool"),
        world_size=2,
        native_kernel=False,
        pythonpath=(str(tmp_path / "shadow"),),
    )
    result = run_job(launch, session_dir=tmp_path / "session")
    expected = (
        "launcher exited with code 1 before reporting: ImportError: this torch is broken on purpose "
        f"(at {broken / '__init__.py'}:1)"
    )
    assert result.status == "failed" and result.root_cause is None
    assert [(r.rank, r.exit_code, r.error) for r in result.ranks] == [(0, None, expected), (1, None, expected)]


@pytest.mark.slow
def test_a_rank_that_exits_with_no_error_says_its_last_line(tmp_path: Path) -> None:
    """A rank that prints why and exits 3 leaves torchrun no error to read; the verdict and the recording say
    the line it printed instead of torchrun's pointer to its docs."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""\
            import sys, time
            import torch.distributed as dist
            dist.init_process_group("gloo")
            if dist.get_rank() == 1:
                print("cannot find the dataset at /data/x", file=sys.stderr, flush=True)
                sys.exit(3)
            time.sleep(60)
            """)
    )
    out = tmp_path / "rec"
    meshtop = Path(sys.executable).with_name("meshtop")
    done = subprocess.run(
        [str(meshtop), "record", str(out), "--", "torchrun", "--standalone", "--nproc-per-node", "2", "train.py"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    said = "cannot find the dataset at /data/x (from the end of the launcher log)"
    assert f"rank 1 failed first: exit code 3: {said}" in done.stdout, done.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["root_cause_rank"] == 1
    assert {r["rank"]: r["error"] for r in manifest["ranks"]}[1] == said
