"""Where a rank's step goes: the windows of its data loading, forward, backward and optimizer.

Rules, each a window of the rank's main thread, in wall-clock time (``time.time_ns``):

- **data** (``d``): each ``__next__`` of a DataLoader's iterator (``_BaseDataLoaderIter.__next__``): the
  time the step loop waited for its next batch. An iterable the loop pulls from that is not a DataLoader is
  not seen (its time stays in the step's rest).
- **forward** (``f``): each call of a root module, a module called while no other module's forward runs.
  The first step learns the roots with torch's global forward hooks; from then on only those modules carry
  hooks (a global hook runs for every submodule, hundreds a forward), so a root first called later (an
  evaluation model) is not seen.
- **backward** (``b``): each ``torch.autograd.backward`` call (``loss.backward()`` calls it) and each
  ``torch.autograd.grad`` call (pipeline schedules' split backward); a forward run inside one (activation
  checkpointing's recomputation) lies inside the backward window.
- **optimizer** (``o``): each optimizer step, from torch's global step pre-hook to its post-hook.

Nested windows of one phase count once (the outermost). Windows overlap where one phase runs inside another
(recomputation inside backward); the metrics core gives each moment to one phase
(:mod:`meshtop.recordings.metrics.breakdown`). At most :data:`MAX_WINDOWS` windows a step are kept: past
that, each new window of a phase widens that phase's last one.

The clocks: data is the host's (the host waits for its batch). On a GPU, forward, backward and optimizer
are the device's: a window's ends are marks in the current stream, placed on the host's wall clock and read
once they have completed, never waited for (:mod:`meshtop.probes.device_clock`); a step's windows are
:class:`StepWindows`, ready when their marks are. On the CPU (and on a GPU whose stream was never seen idle,
so its clock has no anchor) every window is the host's.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from meshtop.probes.device_clock import DeviceClock, Mark
from meshtop.probes.patching import Patches, require

DATA, FORWARD, BACKWARD, OPTIMIZER = "d", "f", "b", "o"
MAX_WINDOWS = 256
"""Windows kept a step; past it, windows of a phase merge into its last one."""


@dataclass(slots=True)
class StepWindows:
    """One step's windows (phase letters, host-clock starts and ends), and on a GPU the device marks of those
    the device times, which stand in for the host's once they have completed (:meth:`ready`)."""

    kinds: str
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    marks: dict[int, tuple[Mark, Mark]] = field(default_factory=dict)
    """Window index -> its (start, end) marks (forward, backward and optimizer windows on a GPU)."""
    clock: DeviceClock | None = None

    def ready(self) -> bool:
        """Whether the windows are final: no marks, or every mark completed."""
        return self.clock is None or not self.marks or self.clock.complete(self._all_marks())

    def final(self) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
        """(kinds, starts, ends) on the host's wall clock: the device's times where marked, once :meth:`ready`;
        the host's before, or where the device clock has no anchor yet."""
        placed = None
        if self.clock is not None and self.marks and self.ready():
            placed = self.clock.host_ns(self._all_marks())
        if placed is None:
            return self.kinds, self.starts, self.ends
        starts, ends = list(self.starts), list(self.ends)
        for number, index in enumerate(self.marks):
            starts[index], ends[index] = placed[2 * number], placed[2 * number + 1]
        return self.kinds, tuple(starts), tuple(ends)

    def _all_marks(self) -> list[Mark]:
        return [mark for pair in self.marks.values() for mark in pair]


class Phases:
    """The windows of one rank's steps, handed out a step at a time (:meth:`take`); ``clock``: a GPU's, whose
    device times forward, backward and optimizer; ``now_ns``: the host's wall clock."""

    def __init__(self, clock: DeviceClock | None = None, *, now_ns: Callable[[], int] = time.time_ns) -> None:
        self._clock = clock
        self._now_ns = now_ns
        self._patches = Patches()
        self._optimizer_hooks: list[Any] = []
        """Torch's global optimizer step hooks, in from the first install to :meth:`close`: switching the probe
        happens inside a step hook (a script's steps end in one), and taking a hook out of the dict torch is
        iterating raises "OrderedDict mutated during iteration" into the script."""
        self._on = False
        self._forward_hooks: list[Any] = []
        self._kinds: list[str] = []
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._marks: dict[int, tuple[Mark, Mark]] = {}
        self._open: dict[str, tuple[int, int, Mark | None]] = {}
        """Phase -> (depth of nested calls, start, its device mark) of its window in progress."""
        self._forward_depth = 0
        self._learning = True
        """The first step: global forward hooks find the root modules."""
        self._roots: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()

    # -- windows -----------------------------------------------------------------------

    def begin(self, phase: str) -> None:
        depth, start, mark = self._open.get(phase, (0, 0, None))
        if depth == 0:
            start = self._now_ns()
            mark = self._clock.mark() if self._clock is not None and phase != DATA else None
        self._open[phase] = (depth + 1, start, mark)

    def end(self, phase: str) -> None:
        depth, start, start_mark = self._open.get(phase, (0, 0, None))
        if depth == 0:
            return  # an end without its begin (hooks installed mid-call)
        if depth > 1:
            self._open[phase] = (depth - 1, start, start_mark)
            return
        del self._open[phase]
        end = self._now_ns()
        end_mark = self._clock.mark() if start_mark is not None and self._clock is not None else None
        # a window marked at both ends is the device's; one whose end fell in a graph capture stays the host's
        if len(self._kinds) >= MAX_WINDOWS:
            for index in range(len(self._kinds) - 1, -1, -1):
                if self._kinds[index] == phase:
                    self._ends[index] = end
                    if end_mark is not None and index in self._marks:
                        self._marks[index] = (self._marks[index][0], end_mark)
                    return
        if start_mark is not None and end_mark is not None:
            self._marks[len(self._kinds)] = (start_mark, end_mark)
        self._kinds.append(phase)
        self._starts.append(start)
        self._ends.append(end)

    def take(self) -> StepWindows:
        """The windows closed since the last call (at a step's end: the device clock's anchor renewed where
        its stream is idle); the first call ends the learning of roots."""
        if self._learning:
            self._learned()
        if self._clock is not None:
            self._clock.anchor_if_idle()
        taken = StepWindows("".join(self._kinds), tuple(self._starts), tuple(self._ends), self._marks, self._clock)
        self._kinds, self._starts, self._ends, self._marks = [], [], [], {}
        return taken

    # -- hooks -------------------------------------------------------------------------

    def install(self) -> None:
        """Every hook, or :class:`~meshtop.probes.patching.MissingInternal` before any where torch lacks one."""
        from torch.utils.data import dataloader

        iterator = require(dataloader, "_BaseDataLoaderIter")
        next_batch = require(iterator, "__next__")
        self._patches.replace(iterator, "__next__", self._timed(next_batch, DATA))
        self._patches.replace(torch.autograd, "backward", self._timed(torch.autograd.backward, BACKWARD))
        self._patches.replace(torch.autograd, "grad", self._timed(torch.autograd.grad, BACKWARD))
        if not self._optimizer_hooks:
            self._optimizer_hooks = [
                register_optimizer_step_pre_hook(self._optimizer_began),
                register_optimizer_step_post_hook(self._optimizer_ended),
            ]
        self._forward_hooks = self._global_hooks() if self._learning else self._root_hooks()
        self._on = True

    def uninstall(self) -> None:
        """Every hook out but the optimizer's, which stay idle (:meth:`install` again puts them back, the roots
        learned kept; :meth:`close` takes every one out)."""
        for hook in self._forward_hooks:
            hook.remove()
        self._forward_hooks = []
        self._patches.restore()
        self._open.clear()
        self._forward_depth = 0
        self._on = False

    def close(self) -> None:
        """Every hook out, for good (outside an optimizer step)."""
        self.uninstall()
        for hook in self._optimizer_hooks:
            hook.remove()
        self._optimizer_hooks = []

    def _optimizer_began(self, *_: Any) -> None:
        if self._on:
            self.begin(OPTIMIZER)

    def _optimizer_ended(self, *_: Any) -> None:
        if self._on:
            self.end(OPTIMIZER)

    def _global_hooks(self) -> list[Any]:
        return [
            register_module_forward_pre_hook(self._global_pre),
            register_module_forward_hook(self._global_post, always_call=True),
        ]

    def _root_hooks(self) -> list[Any]:
        hooks = []
        for root in list(self._roots):
            hooks.append(root.register_forward_pre_hook(lambda *_: self.begin(FORWARD)))
            hooks.append(root.register_forward_hook(lambda *_: self.end(FORWARD), always_call=True))
        return hooks

    def _timed(self, original: Callable[..., Any], phase: str) -> Callable[..., Any]:
        phases = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            phases.begin(phase)
            try:
                return original(*args, **kwargs)
            finally:
                phases.end(phase)

        timed.__wrapped__ = original  # type: ignore[attr-defined]
        return timed

    def _global_pre(self, module: torch.nn.Module, args: Any) -> None:
        if self._forward_depth == 0:
            self._roots.add(module)
            self.begin(FORWARD)
        self._forward_depth += 1

    def _global_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._forward_depth = max(0, self._forward_depth - 1)
        if self._forward_depth == 0:
            self.end(FORWARD)

    def _learned(self) -> None:
        """From the second step on, hooks on the roots only."""
        if self._forward_depth or not self._on:  # inside a forward (learn on), or not installed
            return
        self._learning = False
        for hook in self._forward_hooks:
            hook.remove()
        self._forward_hooks = self._root_hooks()
