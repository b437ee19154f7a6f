"""meshtop's own process keeps the memory of its large buffers instead of handing it back to the kernel.

A live session moves its ranks' events in buffers of a megabyte and more: a node's message to the head
(1.2 MB at a thousand ranks), the head's reads, the blocks it joins and writes. glibc's allocator serves
such a buffer from its own ``mmap`` and gives it back on free (or trims its arena's top under its trim
threshold), so the next buffer of that size takes a page fault for every 4 KiB touched: on this project's
2-core VM, a node forwarding a thousand ranks' events spent 0.46 us of kernel time an event on those
faults, more than the loopback copy itself (0.09 us), and the head as much again
(``python -m tests.bench.fleet``, docs/multinode.md). Raising both thresholds keeps the buffers' pages in
the process, to be reused: the same node's kernel time fell to 0.04 us an event.

Only meshtop's own process (the head and a node's relay, ``run`` and ``record``); never the ranks, which
are the user's. On a C library other than glibc nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameters (``malloc.h``)."""
MMAP_FROM_BYTES = 32 << 20
"""Buffers below this come from the allocator's arenas (glibc's own upper bound for its dynamic threshold)."""
TRIM_FROM_BYTES = 128 << 20
"""Free memory at an arena's top is handed back only past this: what a session may hold unused."""


def keep_buffer_pages() -> bool:
    """Set the allocator's thresholds for this process (see the module); whether it could."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no C library by that name, or not glibc's
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_FROM_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_FROM_BYTES))
