"""An interrupt that comes while pandas is first imported leaves pandas whole for the rest of the process.

A CI soak's SIGTERM reached ``meshtop record`` as its fold first imported pandas: the cut-short import left
pandas' C modules behind, and the recording's finish then failed on its own import of pandas (exit 1, not
130). The test interrupts the import at the same point on purpose: after the C module that hangs its capsule
on the package has loaded, as the next module is looked up."""

from __future__ import annotations

import subprocess
import sys
import textwrap

INTERRUPTED_IMPORT = textwrap.dedent(
    """
    import os, signal, sys
    # A process started with SIGINT ignored (one in the background of a non-interactive shell) keeps it ignored:
    # the interrupt is then never raised, whatever meshtop does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import numpy, pyarrow  # loaded before pandas, as in meshtop
    from meshtop.recordings.lazy_pandas import pandas

    class InterruptOnce:
        def find_spec(self, name, path=None, target=None):
            if name == "pandas._libs.interval":
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGINT)
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


def test_an_interrupt_during_the_first_import_neither_is_lost_nor_breaks_the_next_one() -> None:
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["interrupted", "[0, 1, 0]"], done.stderr[-2000:]
