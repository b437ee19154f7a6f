"""meshtop inside each rank of a user's own script: the built-in runner's probes, attached without touching it.

The bootstrap (``runner/script/bootstrap/sitecustomize.py``) calls :func:`attach` in
every rank torchrun starts, before the script's first line. From then on:

- **collectives**: the collective probe is hooked at once. Its kernels sit on
  the c10d dispatcher ops, so DDP, FSDP2, DTensor, functional collectives and
  direct calls are all seen. Groups are named by the dims of the meshes the
  script makes with ``init_device_mesh(..., mesh_dim_names=...)``, else
  ``world``, else by their ranks (``ranks 0,2``).
- **steps**: one per ``step()`` of the first optimizer the script steps (torch's
  global optimizer step hooks). Step 0 begins at the first module forward,
  step k + 1 where step k's optimizer step ended, so a step is the script's
  whole iteration (data, forward, backward, optimizer, logging);
  ``forward_backward_s`` runs to the optimizer step's start. A script without
  an optimizer has collectives and samples and no steps.
- **loss**: each step's, the mean of the losses the script differentiated in it
  (:mod:`meshtop.probes.losses`: ``loss.backward()``, a pipeline schedule's loss
  function), unless ``--no-loss``. On a GPU it is read once its copy to the host
  has completed, so a step's timing waits for it (a step or two), and never
  synchronises the device.
- **memory**: at each step's end, weights, gradients and optimizer state from
  that optimizer's parameters and state (DTensor shards by their local size);
  with ``--activations``, the peak bytes saved for backward in the step
  (:mod:`meshtop.probes.activations`; the first module called and the optimizer's
  parameters are the weights left out).
- **pipelines**: the stage probe is installed when the script imports
  ``torch.distributed.pipelining`` (a post-import hook: importing it costs
  about 0.9 s, which a script that does not use it should not pay here).
- **failures**: an exception that ends the script is written to torchrun's
  error file, as ``@record`` would, so meshtop names the rank with its error.

Before the script destroys a process group, the finished collectives are read
(the C++ kernel's are read in batches), while c10d still knows the group's
name; at exit what the probes hold is flushed and the sink closed.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import sys
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from functools import wraps
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType, TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import device_mesh
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from meshtop.probes.activations import SavedActivations
from meshtop.probes.device_clock import poll
from meshtop.probes.events import RankStarted, StepTiming
from meshtop.probes.groups import GroupDirectory
from meshtop.probes.instrument import Instrumentation
from meshtop.probes.losses import PendingLoss
from meshtop.probes.memory import local_numel
from meshtop.probes.patching import Patches
from meshtop.probes.phases import StepWindows
from meshtop.probes.shipper import EventShipper, open_sink
from meshtop.probes.sink import EventSink
from meshtop.probes.wire import node_of_this_rank, start_of_this_rank
from meshtop.runner.script.command import ACTIVATIONS_ENV, DEVICE_ENV, INSTRUMENT_ENV, LOSS_ENV, TOKENS_ENV

PIPELINING = "torch.distributed.pipelining"
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
"""Where torchrun reads a rank's error (``torch.distributed.elastic.multiprocessing.errors``)."""
LOSS_WAIT_S = 2.0
"""At exit, how long the steps whose loss is still on its way to the host wait for it (a device that hung
is not waited on longer: those steps go out without a loss)."""
MAX_WAITING_STEPS = 64
"""Steps held for their loss (and device-timed phases) at most; an older one goes out without them (a device
this far behind the host)."""
GIL_HANDOFF_S = 0.2
"""How long ``destroy_process_group`` leaves the GIL to gloo's threads (:meth:`Attachment._read_before_destroy`)."""


@contextmanager
def never_raises(where: str) -> Iterator[None]:
    """A hook in the user's forward or optimizer step: an error of meshtop's is said on stderr, never raised
    into the script."""
    try:
        yield
    except Exception as error:  # a probe never breaks the job it measures
        print(f"meshtop: probe error in {where}, ignored: {type(error).__name__}: {error}", file=sys.stderr)


@dataclass(slots=True)
class WaitingStep:
    """A step whose loss or device-timed phases are on their way to the host (a GPU's)."""

    timing: StepTiming
    loss: PendingLoss | None
    windows: StepWindows | None

    def ready(self) -> bool:
        return (self.loss is None or self.loss.ready()) and (self.windows is None or self.windows.ready())

    def finished(self) -> StepTiming:
        """The step with what has come: its loss where read, its phases on the device's clock where their marks
        completed (else the host's)."""
        timing = self.timing
        if self.loss is not None and self.loss.ready() and (loss := self.loss.value()) is not None:
            timing = replace(timing, loss=loss, losses=self.loss.count)
        if self.windows is not None:
            kinds, starts, ends = self.windows.final()
            timing = replace(timing, phases=kinds, phase_start_ns=starts, phase_end_ns=ends)
        return timing


class ScriptSteps:
    """The steps of a user's script: one per optimizer step of the first optimizer it steps."""

    def __init__(
        self,
        *,
        rank: int,
        probes: Instrumentation,
        sink: EventSink,
        tokens: int,
        on_parameters: Callable[[list[torch.Tensor]], None],
        on_first_forward: Callable[[torch.nn.Module], None],
    ) -> None:
        self.rank = rank
        self.probes = probes
        self.sink = sink
        self.tokens = tokens
        self.on_parameters = on_parameters
        """Called with the counted optimizer's parameters when it is first stepped."""
        self.on_first_forward = on_first_forward
        """Called with the first module the script calls."""
        self._waiting: deque[WaitingStep] = deque()
        """Steps whose loss or phases are on their way to the host (a GPU's), oldest first."""
        self.step = 0
        self._optimizer: weakref.ref[torch.optim.Optimizer] | None = None
        self._start_ns: int | None = None
        self._cpu_start_s = 0.0
        self._optimizer_start_ns: int | None = None
        self._first_forward = register_module_forward_pre_hook(self._on_first_forward)
        self._hooks = [
            register_optimizer_step_pre_hook(self._before_optimizer),
            register_optimizer_step_post_hook(self._after_optimizer),
        ]

    def _begin(self, start_ns: int) -> None:
        self._start_ns, self._cpu_start_s = start_ns, time.process_time()
        self.probes.step_started(self.step)

    def _on_first_forward(self, module: torch.nn.Module, args: Any) -> None:
        self._first_forward.remove()  # the hooks are copied before they run: removing it here is safe
        with never_raises("the first forward"):
            self.on_first_forward(module)
            if self._start_ns is None:
                self._begin(time.time_ns())

    def _ours(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` is the one whose steps count (the first one stepped)."""
        if self._optimizer is None:
            self._optimizer = weakref.ref(optimizer)
            parameters = [p for group in optimizer.param_groups for p in group["params"]]
            self.probes.watch_memory(parameters=parameters, optimizer=optimizer)
            self.on_parameters(parameters)
        return self._optimizer() is optimizer

    def _before_optimizer(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        with never_raises("an optimizer step"):
            if not self._ours(optimizer):
                return
            if self._start_ns is None:  # no module forward came first (a hand-written model of plain tensors)
                self._begin(time.time_ns())
            self._optimizer_start_ns = time.time_ns()

    def _after_optimizer(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        with never_raises("an optimizer step"):
            self._close_step(optimizer)

    def _close_step(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._ours(optimizer) or self._start_ns is None:
            return
        end_ns = time.time_ns()
        cpu_s = time.process_time() - self._cpu_start_s
        pipeline_wait_s = self.probes.step_ended(self.step)
        forward_backward_ns = (self._optimizer_start_ns or end_ns) - self._start_ns
        timing = StepTiming(
            rank=self.rank,
            step=self.step,
            start_ns=self._start_ns,
            duration_s=(end_ns - self._start_ns) / 1e9,
            tokens=self.tokens,
            loss=None,
            forward_backward_s=forward_backward_ns / 1e9,
            instrumented=self.probes.enabled,
            pipeline_wait_s=pipeline_wait_s,
            cpu_s=cpu_s,
        )
        waiting = WaitingStep(timing, self.probes.take_loss(), self.probes.take_phases())
        if not self._waiting and waiting.ready():
            self.sink.emit(waiting.finished())
        else:  # behind the steps still waiting for theirs, in order
            self._waiting.append(waiting)
            self._send_ready()
        self.step += 1
        self._begin(end_ns)

    def _send_ready(self, *, wait_s: float = 0.0) -> None:
        """Send the waiting steps whose loss and phases have reached the host, in order (``wait_s``: at exit,
        how long in all to wait for the rest)."""
        deadline = time.monotonic() + wait_s
        while self._waiting:
            head = self._waiting[0]
            ready = head.ready() or (wait_s > 0 and poll(head.ready, max(0.0, deadline - time.monotonic())))
            if not ready and len(self._waiting) <= MAX_WAITING_STEPS:
                return
            self.sink.emit(self._waiting.popleft().finished())

    def remove(self) -> None:
        self._send_ready(wait_s=LOSS_WAIT_S)
        self._first_forward.remove()
        for hook in self._hooks:
            hook.remove()


class _ImportedLoader(Loader):
    """``loader``, then ``on_imported()`` once the module has run (a wrapper: another module may share ``loader``)."""

    def __init__(self, loader: Any, on_imported: Callable[[], None]) -> None:
        self._loader = loader
        self._on_imported = on_imported

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with never_raises(f"after importing {module.__name__}"):
            self._on_imported()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _AfterImport(MetaPathFinder):
    """Runs ``on_imported`` once the module ``name`` has been imported (Python has no post-import hook).

    It stays on ``sys.meta_path`` until the module has run: a ``find_spec`` probe that imports nothing does not
    use it up.
    """

    def __init__(self, name: str, on_imported: Callable[[], None]) -> None:
        self.name = name
        self.on_imported = on_imported

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ImportedLoader(spec.loader, self._ran)
        return spec

    def _ran(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self.on_imported()


def after_import(name: str, on_imported: Callable[[], None]) -> None:
    """``on_imported()`` now if ``name`` is imported already, else right after it is."""
    if name in sys.modules:
        on_imported()
    else:
        sys.meta_path.insert(0, _AfterImport(name, on_imported))


class Attachment:
    """What :func:`attach` put into this rank, taken out again at exit."""

    def __init__(
        self,
        *,
        rank: int,
        device: torch.device,
        sink: EventSink,
        tokens: int,
        hooks: bool,
        activations: bool = False,
        loss: bool = True,
    ) -> None:
        self.rank = rank
        self.sink = sink
        self.probes = Instrumentation(rank=rank, sink=sink, device=device, enabled=hooks)
        if isinstance(sink, EventShipper):
            sink.before_shipment = self.probes.shipment
        self.groups = GroupDirectory()
        self._patches = Patches()
        self.probes.install(groups=self.groups, pipeline=False, phases=True, loss=loss)
        self.device = device
        self._place: tuple[int, int, tuple[int, ...]] = (0, rank, ())
        """(pp rank, dp rank, stages) as :class:`RankStarted` says them."""
        self._parameters: tuple[int, int | None] = (0, None)
        """(local, model) parameter elements, once the first optimizer step says them."""
        self._started()
        self._name_meshes()
        self._read_before_destroy()
        after_import(PIPELINING, self._on_pipelining)
        self.activations = SavedActivations() if activations and hooks else None
        if self.activations is not None:
            self.activations.install()  # on the main thread, which runs the script's forward passes
            self.probes.watch_activations(self.activations)
        self.steps = ScriptSteps(
            rank=rank,
            probes=self.probes,
            sink=sink,
            tokens=tokens,
            on_parameters=self._on_parameters,
            on_first_forward=self._on_first_forward,
        )
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook

    def _started(self) -> None:
        (pp_rank, dp_rank, stages), (local, model) = self._place, self._parameters
        world_size, restart = start_of_this_rank()
        self.sink.emit(
            RankStarted(
                rank=self.rank,
                pid=os.getpid(),
                host=socket.gethostname(),
                device=str(self.device),
                pp_rank=pp_rank,
                dp_rank=dp_rank,
                tp_rank=0,
                stages=stages,
                local_parameters=local,
                model_parameters=model,
                wall_ns=time.time_ns(),
                node=node_of_this_rank(),
                world_size=world_size,
                restart=restart,
            )
        )

    def _on_pipelining(self) -> None:
        """The script imported pipelining: time its stages, and read its schedules' losses."""
        self.probes.add_stage_probe(on_stage=self._on_stages)
        self.probes.read_schedule_losses()

    def _on_stages(self, stages: tuple[int, ...]) -> None:
        """The rank runs pipeline stages: say again where it sits, its first stage as its pipeline rank."""
        self._place = (stages[0], 0, stages)
        self._started()

    def _on_parameters(self, parameters: list[torch.Tensor]) -> None:
        """The first optimizer step: say again what the rank trains, locally and in the whole model."""
        self._parameters = (sum(local_numel(p) for p in parameters), sum(p.numel() for p in parameters))
        if self.activations is not None:
            self.activations.leave_out(parameters)
        self._started()

    def _on_first_forward(self, module: torch.nn.Module) -> None:
        """The first module the script calls holds (or is) its model: its weights are not activations."""
        if self.activations is not None:
            self.activations.leave_out(module.parameters())

    def _name_meshes(self) -> None:
        """Name the groups of every mesh ``init_device_mesh`` makes by its dims."""
        original = device_mesh.init_device_mesh
        groups = self.groups

        @wraps(original)
        def init_device_mesh(*args: Any, **kwargs: Any) -> Any:
            mesh = original(*args, **kwargs)
            with suppress(Exception):  # a probe never breaks the job: the groups keep their rank names
                groups.add_mesh(mesh, replace=True)
            return mesh

        self._patches.replace(device_mesh, "init_device_mesh", init_device_mesh)
        if getattr(dist, "init_device_mesh", None) is original:
            self._patches.replace(dist, "init_device_mesh", init_device_mesh)

    def _read_before_destroy(self) -> None:
        original = dist.destroy_process_group
        probes, groups = self.probes, self.groups

        @wraps(original)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            with never_raises("destroy_process_group"):
                probes.flush()
            try:
                return original(*args, **kwargs)
            finally:
                groups.forget()  # c10d reuses group names after a destroy: learn them again
                # Let gloo's worker threads finish destroying their last works before the script goes on.
                # A work made in backward holds a Python object in its thread-local state, and the thread
                # that drops the work last needs the GIL to free it; if that is a gloo thread at the moment
                # the script frees its DDP model (whose reducer's process group joins those threads while
                # holding the GIL), the rank deadlocks at exit (pytorch/pytorch#56297). Sleeping releases
                # the GIL to them; without it, 2 runs in 12 of examples/ddp.py hung under a loaded CPU.
                time.sleep(GIL_HANDOFF_S)

        self._patches.replace(dist, "destroy_process_group", destroy_process_group)

    def _excepthook(self, kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        """Write the error for torchrun as ``@record`` does (unless the script's own ``@record`` did), then
        report it as before."""
        path = os.environ.get(ERROR_FILE_ENV)
        if path and not os.path.exists(path):
            record = {
                "message": {
                    "message": f"{kind.__name__}: {error}",
                    "extraInfo": {
                        "py_callstack": "".join(traceback.format_exception(kind, error, trace)),
                        "timestamp": str(int(time.time())),
                    },
                }
            }
            # Whole or not at all: torchrun reads the file of every rank that exited, and a rank killed between
            # open and write (torchrun's own SIGKILL of the ranks left, after its grace) left an empty file that
            # crashed torchrun's agent with a JSONDecodeError before it said how any rank ended (seen in the soak).
            partial = f"{path}.{os.getpid()}.tmp"
            try:
                with open(partial, "w") as file:
                    json.dump(record, file)
                os.replace(partial, path)
            except OSError:  # the traceback below still says it
                with contextlib.suppress(OSError):
                    os.unlink(partial)
        self._previous_excepthook(kind, error, trace)

    def detach(self) -> None:
        """At exit: the hooks out, what the probes hold sent, the sink closed."""
        self.steps.remove()
        if self.activations is not None:
            self.activations.uninstall()
        self.probes.uninstall()
        self._patches.restore()
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_excepthook
        self.sink.close()


def attach() -> Attachment:
    """Attach meshtop to this rank (torchrun's ``RANK`` and ``LOCAL_RANK`` say which)."""
    rank = int(os.environ["RANK"])
    # Not torch.cuda.is_available(): it would initialise CUDA before a script that sets CUDA_VISIBLE_DEVICES
    # from LOCAL_RANK; the launcher says cuda only where it saw GPUs.
    cuda = os.environ.get(DEVICE_ENV) == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    attachment = Attachment(
        rank=rank,
        device=device,
        sink=open_sink(rank),
        tokens=int(os.environ.get(TOKENS_ENV, "0")),
        hooks=os.environ.get(INSTRUMENT_ENV, "1") == "1",
        activations=os.environ.get(ACTIVATIONS_ENV) == "1",
        loss=os.environ.get(LOSS_ENV, "1") == "1",
    )
    atexit.register(attachment.detach)
    return attachment
