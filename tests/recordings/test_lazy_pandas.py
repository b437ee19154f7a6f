"""An interrupt that comes while pandas is first imported leaves pandas whole for the rest of the process.

A CI soak's SIGTERM reached ``meshtop record`` as its fold first imported pandas: the cut-short import left
pandas' C modules behind, and the recording's finish then failed on its own import of pandas (exit 1, not
130). The test interrupts the import at the same point on purpose: after the C module that hangs its capsule
on the package has loaded, as the next module is looked up."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

INTERRUPTED_IMPORT = textwrap.dedent(
    """
    import signal, sys, threading
    print(signal.getsignal(signal.SIGINT), sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])), file=sys.stderr)
    import numpy, pyarrow  # loaded before pandas, as in meshtop
    from meshtop.recordings.lazy_pandas import pandas

    class InterruptOnce:
        def find_spec(self, name, path=None, target=None):
            if name == "pandas._libs.interval":
                sys.meta_path.remove(self)
                # To the main thread, as a terminal's Ctrl-C reaches it: sent to the process from the importing
                # thread, the signal was once (CI, 2 loaded cores) taken on that thread and never raised.
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            return None

    assert "pandas" not in sys.modules
    sys.meta_path.insert(0, InterruptOnce())
    try:
        pandas()
        print("not interrupted")
    except KeyboardInterrupt:
        print("interrupted")
    print(pandas().factorize(numpy.array([3, 1, 3]))[0].tolist())
    """
)


@pytest.mark.slow  # in the serial lane: in the fast lane of two fresh clones' CI rehearsals (2026-12-04) it saw
# "not interrupted" (the interrupt never raised in the waiting main thread), and never in 20 runs since, alone,
# beside busy loops, or in the fast lane again; the cause is not found, and its stderr now says the SIGINT
# handler and mask the child started with
def test_an_interrupt_during_the_first_import_neither_is_lost_nor_breaks_the_next_one() -> None:
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["interrupted", "[0, 1, 0]"], done.stderr[-2000:]
