"""Test-only: make every Python process of a launched job look like a torch release without an internal, or
run on a clock that is off.

``tests/probes/test_guarded_installs.py`` puts this folder on ``PYTHONPATH`` (which the
launcher passes on to the ranks) and names, in :data:`MOVE_ENV`, a method of
``torch.distributed.pipelining.stage._PipelineStageBase``. Python imports
``sitecustomize`` at start-up, so each rank starts with that method moved from
the base class to its subclasses: the pipeline schedules still find it on
their stages, as they would in a release that had moved it, while the stage
probe, which hooks the base class, finds it missing.
"""

from __future__ import annotations

import os

MOVE_ENV = "MESHTOP_TEST_MOVE_STAGE_METHOD"

if method_name := os.environ.get(MOVE_ENV):
    from torch.distributed.pipelining import stage

    method = vars(stage._PipelineStageBase)[method_name]
    for subclass in stage._PipelineStageBase.__subclasses__():
        if method_name not in vars(subclass):
            setattr(subclass, method_name, method)
    delattr(stage._PipelineStageBase, method_name)

CLOCK_SHIFT_ENV = "MESHTOP_TEST_CLOCK_SHIFT_S"
"""Seconds to move this process's wall clock by (``time.time`` and ``time.time_ns``): every process of a
launched job inherits it, so a node of ``tests/runner/test_multinode.py`` runs on a clock that is that far off."""

if shift := os.environ.get(CLOCK_SHIFT_ENV):
    import time

    _shift_ns = int(float(shift) * 1e9)
    _time_ns, _time = time.time_ns, time.time
    time.time_ns = lambda: _time_ns() + _shift_ns
    time.time = lambda: _time() + _shift_ns / 1e9
