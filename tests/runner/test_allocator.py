"""meshtop's process keeps its large buffers' pages (:mod:`meshtop.runner.job.allocator`)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

WORKLOAD = """
import resource, sys
import numpy as np
from meshtop.runner.job.allocator import keep_buffer_pages
if sys.argv[1] == "tuned":
    assert keep_buffer_pages()
# a node's block of its ranks' lines, formatted a step at a time, as the fleet benchmark's nodes fill theirs
template = b'{"rank":1,"start_ns":%d,"end_ns":%d,"bytes":8388608,"op":"all_reduce","group":"tp"}\\n' * 5000
deltas = np.arange(10_000, dtype=np.float64) * 1e3
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for step in range(100):
    values = 1796402038711783904 + step + deltas.astype(np.int64)
    block = template % tuple(values.tolist())
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", WORKLOAD, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")
def test_buffers_formatted_again_and_again_stop_faulting_in_new_pages() -> None:
    plain, tuned = page_faults("plain"), page_faults("tuned")
    # measured 15,343 against 468: each block's pages were mapped afresh, then kept
    assert tuned * 5 < plain, (plain, tuned)
