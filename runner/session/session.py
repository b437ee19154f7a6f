"""One session of a job: run it, keep every event in its recording, and close the recording with how it ended.

The console (``record``) and the live dashboard (``run``) both drive a job
through :func:`run_session`, so a session is recorded the same way whichever
front end watches it. A session folds its events once, into its
:class:`~meshtop.recordings.session_fold.SessionFold`: the console's progress
and verdict, the manifest's step count, ``/metrics`` and the dashboard all
read that one fold.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from meshtop.probes.arrivals import Arrivals
from meshtop.recordings.folding import FoldThread
from meshtop.recordings.manifest import (
    LOAD_FILE,
    Endpoint,
    Manifest,
    Plan,
    RecordingError,
    RunDescription,
    SampleRates,
    Script,
    ServerInfo,
    keep_room,
    new_recording,
    script_plan,
    start_manifest,
    write_manifest,
)
from meshtop.recordings.prometheus import RunMetrics
from meshtop.recordings.recorder import Ending, SessionRecorder
from meshtop.recordings.session_fold import Folded, SessionFold
from meshtop.recordings.writers import ProgressWriter, claim_recording, progress_of
from meshtop.runner.job.control import JobControl
from meshtop.runner.job.environment import Launch, builtin_launch, rank_environment
from meshtop.runner.job.launch import run_job
from meshtop.runner.job.supervise import NodeProbes
from meshtop.runner.multinode.fleet import Fleet
from meshtop.runner.multinode.nodes import Nodes
from meshtop.runner.plan import ResolvedRun, recipe_words
from meshtop.runner.results import JobResult
from meshtop.runner.script.command import (
    ACTIVATIONS_ENV,
    ATTACH_ENV,
    BOOTSTRAP_DIR,
    DEVICE_ENV,
    INSTRUMENT_ENV,
    LOSS_ENV,
    TOKENS_ENV,
    ScriptRun,
    environment_that_matters,
)
from meshtop.runner.serving.endpoint import EndpointRun
from meshtop.runner.serving.run import run_endpoint
from meshtop.runner.session.control_socket import ControlServer

Run = ResolvedRun | ScriptRun | EndpointRun
"""What the user asked to run: the built-in runner's plan, a user's own script, or a load sent to a serving
endpoint."""


class Work(Protocol):
    """A run as a session runs it: each kind of :data:`Run` says how it is described, headed and run
    (:func:`work_of` finds a run's). By default it is a job torchrun launches on this node, which
    :func:`run_job` follows."""

    def describe(self) -> RunDescription:
        """The run description a recording of it holds."""
        ...

    def headline(self) -> str:
        """The line ``record`` prints first."""
        ...

    def folder_name(self) -> str:
        """The end of the name of a session's folder (after its time), e.g. ``dp2-tp1-pp1``."""
        ...

    def total_steps(self) -> int | None:
        """Steps it runs, where it says."""
        return None

    def on_nodes(self, given: Callable[[], Nodes | None]) -> Nodes | None:
        """The nodes it runs on: a script's, its torchrun options'; the others', meshtop's own (``given``)."""
        return given()

    def launch(self, directory: Path, nodes: Nodes | None = None) -> Launch:
        """How it is launched on this node (a node other than the head launches its own ranks)."""
        raise TypeError(f"{type(self).__name__} has no torchrun launch")

    def run(self, context: RunContext) -> JobResult:
        """Run it to its end (:class:`RunContext`: what the session gives it)."""
        nodes = self.on_nodes(lambda: context.options.nodes)
        return run_job(
            self.launch(context.directory, nodes),
            session_dir=context.directory,
            on_events=context.on_events,
            node_probes=context.options.node_probes,
            control=context.control,
            hang_timeout_s=context.options.hang_timeout_s,
            fleet=Fleet(nodes),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionOptions:
    """What the command line asks of a session beside the work it runs (``run``, ``record`` and a sweep alike)."""

    node_probes: NodeProbes = NodeProbes()
    """The node's samplers and their rates."""
    hang_timeout_s: float | None = None
    """How long no rank may make progress before the job is reported hung (``None``:
    :func:`meshtop.runner.job.hangs.default_timeout_s`)."""
    nodes: Nodes | None = None
    """The nodes the job spans, meshtop's own (``None``: this machine alone, or a script's torchrun options)."""
    metrics: RunMetrics | None = None
    """The series ``--metrics-port`` serves, fed every batch."""


@dataclass(frozen=True, slots=True)
class RunContext:
    """What a session gives the work it runs."""

    directory: Path
    """The session's folder: the launcher's logs, and the recording where there is one."""
    on_events: Callable[[Arrivals], None]
    """Takes each batch of events (the session records it, then folds it)."""
    on_described: Callable[[RunDescription], None]
    """Takes the run's description again where running it told more (a server's model and how it ran)."""
    control: JobControl | None
    options: SessionOptions


def ending_of(result: JobResult) -> Ending:
    return Ending(
        status=result.status,
        duration_s=result.duration_s,
        ranks=result.ranks,
        root_cause_rank=result.root_cause,
        hang=result.hang,
        reason=result.node_lost or result.failure,
    )


def script_launch(script: ScriptRun) -> Launch:
    """The script under torchrun (or ``accelerate launch``), with meshtop's bootstrap first on its path."""
    env = {ATTACH_ENV: "1", DEVICE_ENV: script.device, INSTRUMENT_ENV: "1" if script.instrument else "0"}
    if script.tokens_per_step is not None:
        env[TOKENS_ENV] = str(script.tokens_per_step)
    if script.activations:
        env[ACTIVATIONS_ENV] = "1"
    if not script.loss:
        env[LOSS_ENV] = "0"
    return Launch(
        launcher_args=script.launcher_args,
        world_size=script.world_size,
        native_kernel=script.device == "cpu" and script.instrument,
        env=env,
        pythonpath=(str(BOOTSTRAP_DIR),),
        nodes=script.nodes,
        launcher=script.launcher,
    )


def describe(run: Run) -> RunDescription:
    """The run description a recording of ``run`` holds."""
    return work_of(run).describe()


def endpoint_bases(run: EndpointRun) -> str:
    """The endpoint's base URL, or its replicas' (``http://a:8000 + http://b:8000``)."""
    return " + ".join(origin.base for origin in run.origins)


def endpoint_description(run: EndpointRun, server: ServerInfo | None = None) -> RunDescription:
    """The run description of a load sent to ``run``'s endpoint: the load, the server (how a server meshtop
    started ran, once it is known), and no plan of meshtop's own (one process, the load generator)."""
    if server is None and run.server is not None:  # not started yet: its command
        server = ServerInfo(command=run.server.command)
    return RunDescription(
        plan=Plan(dp=1, world_size=1, label=f"endpoint {endpoint_bases(run)} ({run.api})"),
        mode="infer",
        model=None,
        dtype=None,
        device="endpoint",
        steps=None,
        batch_size=None,
        microbatch_size=None,
        seq_len=None,
        seed=run.load.seed,
        instrumented=False,
        load=run.load,
        endpoint=Endpoint(
            url=run.url,
            api=run.api,
            model=run.model,
            models=run.models,
            replicas=tuple(origin.root for origin in run.origins) if len(run.origins) > 1 else (),
            same_load=run.same_load,
            server_metrics=",".join(run.metrics_urls),
            server=server,
        ),
    )


def script_description(script: ScriptRun, environment: dict[str, str]) -> RunDescription:
    """The run description of ``script``: its world size as the plan, the rest its own."""
    plan = script_plan(script.name, script.world_size, script.launcher)
    section = Script(
        command=script.command,
        launcher=script.launcher,
        launcher_args=script.launcher_args,
        path=str(script.script) if script.script is not None else None,
        module=script.module,
        args=script.script_args,
        sha256=script.sha256,
        working_dir=os.getcwd(),
        environment=environment,
        tokens_per_step=script.tokens_per_step,
        activations=script.activations,
        loss=script.loss,
    )
    return RunDescription(
        plan=plan,
        mode="train",
        model=None,
        dtype=script.dtype,
        device=script.device,
        steps=None,
        batch_size=None,
        microbatch_size=None,
        seq_len=None,
        seed=None,
        instrumented=script.instrument,
        script=section,
    )


def work_of(run: Run) -> Work:
    """``run`` as a session runs it."""
    if isinstance(run, ResolvedRun):
        return BuiltinWork(run)
    return ScriptWork(run) if isinstance(run, ScriptRun) else EndpointWork(run)


@dataclass(frozen=True, slots=True)
class BuiltinWork(Work):
    """The built-in runner's model on a parallel plan: trained, or serving a load of requests."""

    plan: ResolvedRun

    def describe(self) -> RunDescription:
        return self.plan.describe()

    def headline(self) -> str:
        run = self.plan
        params = run.shape.parameter_count()
        size = f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"
        recipe = recipe_words(run.dtype, run.precision, run.checkpoint)
        start = f"meshtop: {run.plan.label} · model {run.shape.name} ({size} params) · {run.device} {recipe} · "
        if run.load is None:
            length = (
                f"{run.steps} steps"
                if run.steps is not None
                else f"steps until stopped ({run.time_limit_s or 0:g} s at most)"
            )
            return start + f"{run.plan.world_size} ranks · {length} of {run.batch_size} x {run.seq_len} tokens"
        load = run.load
        arrivals = (
            f"{load.concurrency} in flight"
            if load.concurrency is not None
            else f"{load.request_rate_per_s:g} req/s Poisson"
        )
        return start + (
            f"{run.plan.world_size} ranks · {load.requests} requests ({arrivals}), prompt {span(load.prompt_len)}, "
            f"output {span(load.output_len)} tokens, max batch {load.max_batch}"
        )

    def folder_name(self) -> str:
        plan = self.plan.plan
        return f"{'fsdp' if plan.fsdp else 'dp'}{plan.dp}-tp{plan.tp}-pp{plan.pp}" + (
            "-infer" if self.plan.mode == "infer" else ""
        )

    def total_steps(self) -> int | None:
        return self.plan.steps

    def launch(self, directory: Path, nodes: Nodes | None = None) -> Launch:
        return builtin_launch(self.plan, directory, nodes)


@dataclass(frozen=True, slots=True)
class ScriptWork(Work):
    """A user's own script under torchrun (or ``accelerate launch``), meshtop's bootstrap first on its path."""

    script: ScriptRun

    def describe(self) -> RunDescription:
        return script_description(self.script, environment_that_matters(rank_environment(script_launch(self.script))))

    def headline(self) -> str:
        run = self.script
        label = script_plan(run.name, run.world_size, run.launcher).label
        return f"meshtop: {label} · {run.device} · {shlex.join(run.command)}"

    def folder_name(self) -> str:
        return self.script.script.stem if self.script.script else str(self.script.module)

    def on_nodes(self, given: Callable[[], Nodes | None]) -> Nodes | None:
        return self.script.nodes

    def launch(self, directory: Path, nodes: Nodes | None = None) -> Launch:
        return script_launch(self.script)


@dataclass(frozen=True, slots=True)
class EndpointWork(Work):
    """A load of requests sent to a serving endpoint (and the server meshtop starts for it, if asked)."""

    endpoint: EndpointRun
    server: ServerInfo | None = None
    """The server a capacity sweep started before this run (its first copy's), for the manifest: this run
    neither starts nor stops it."""

    def describe(self) -> RunDescription:
        return endpoint_description(self.endpoint, self.server)

    def headline(self) -> str:
        run, sent = self.endpoint, self.endpoint.load
        arrivals = (
            f"{sent.concurrency} in flight"
            if sent.concurrency is not None
            else f"{sent.request_rate_per_s:g} req/s "
            + ("Poisson" if sent.burstiness == 1 else f"gamma (burstiness {sent.burstiness:g})")
        )
        prompts = f"prompts from {sent.prompts}" if sent.prompts else f"prompt {span(sent.prompt_len)} words"
        warmup = f" after {sent.warmup} warmup" if sent.warmup else ""
        if sent.duration_s is not None:
            warmup += f", for {sent.duration_s:g} s at most"
        model = run.model or "(the server's)"
        started = f" · started by meshtop: {shlex.join(run.server.command)}" if run.server is not None else ""
        return (
            f"meshtop: endpoint {endpoint_bases(run)} · {run.api} · model {model}{started} · {sent.requests} requests "
            f"({arrivals}){warmup}, {prompts}, output {span(sent.output_len)} tokens"
            + (f" · the load of {run.same_load}" if run.same_load else "")
        )

    def folder_name(self) -> str:
        return f"endpoint-{self.endpoint.name}"

    def run(self, context: RunContext) -> JobResult:
        def resolved(run: EndpointRun, server: ServerInfo | None) -> None:
            if self.endpoint.server is not None:  # the model and how the server ran: known only now
                context.on_described(endpoint_description(run, server))

        return run_endpoint(
            self.endpoint,
            session_dir=context.directory,
            requests_path=context.directory / LOAD_FILE,
            on_events=context.on_events,
            node_probes=context.options.node_probes,
            control=context.control,
            on_resolved=resolved,
        )


def span(bounds: tuple[int, int]) -> str:
    """``128`` for one length, ``64-128`` for a range."""
    return str(bounds[0]) if bounds[0] == bounds[1] else f"{bounds[0]}-{bounds[1]}"


def start_recording(directory: Path, run: Work, probes: NodeProbes, command_line: list[str]) -> Manifest:
    """Make ``directory`` a new recording with its starting manifest (status ``running``)."""
    new_recording(directory)
    claim_recording(directory)  # before the manifest: one that says running beside no writer is from before writers
    manifest = start_manifest(
        run.describe(),
        command_line=command_line,
        node_probes=SampleRates(gpu_hz=probes.gpu_hz, process_hz=probes.process_hz),
    )
    try:
        write_manifest(directory, manifest)
    except OSError as error:
        raise RecordingError(f"cannot write the manifest in {directory}: {error.strerror or error}") from None
    keep_room(directory)
    return manifest


def run_session(
    work: Work,
    *,
    directory: Path,
    manifest: Manifest | None,
    on_events: Callable[[Arrivals, Folded], None],
    options: SessionOptions = SessionOptions(),
    control: JobControl | None = None,
    session: SessionFold | None = None,
) -> JobResult:
    """Run the job, recording into ``directory`` when a ``manifest`` is given (else it only holds the logs).

    Every batch is folded once, into ``session`` (the session's fold, made here unless the front end made it
    to read it), which ``options.metrics`` (``--metrics-port``) reads and counts each batch's events of. On
    many nodes this is the head's session (``options.nodes.rank`` 0): the other nodes' events come to it too
    (:mod:`meshtop.runner.session.relay`).

    ``on_events`` sees each batch after it is on disk and folded, with what the
    fold took of it (its tables, the job steps it completed), on the fold's own
    thread (:mod:`meshtop.recordings.folding`: the session's thread only
    drains and writes); it decodes any other kind it needs. The recording is
    closed however the session ends, once every batch is folded.
    """
    description = manifest.run if manifest is not None else work.describe()
    session = session if session is not None else SessionFold(description)
    control = control if control is not None else JobControl()
    viewers = ControlServer(directory, control) if manifest is not None else None
    if viewers is not None and not viewers.start():  # how a viewer (``meshtop watch``) acts on the job
        viewers = None
    recorder = SessionRecorder(session, directory, manifest)
    metrics = options.metrics
    if metrics is not None:
        metrics.follow(session)
    result = None
    broken = Ending(status="failed", duration_s=None)
    ran: list[RunDescription] = []
    """The run as it turned out, where it says more than at its start."""

    progress = ProgressWriter(directory, lambda: progress_of(session)) if manifest is not None else None

    def count_and_show(arrivals: Arrivals, folded: Folded) -> None:
        if metrics is not None:
            metrics.take(arrivals, folded)
        if progress is not None:
            progress.offer()
        on_events(arrivals, folded)

    folding = FoldThread(recorder, count_and_show)

    def record_and_fold(arrivals: Arrivals) -> None:
        recorder.write(arrivals)  # on disk first, then folded on the fold's own thread
        folding.put(arrivals)

    try:
        result = work.run(RunContext(directory, record_and_fold, ran.append, control, options))
    except KeyboardInterrupt:
        broken = Ending(status="interrupted", duration_s=None)
        raise
    except BaseException as error:
        broken = Ending(status="failed", duration_s=None, reason=str(error).splitlines()[0] if str(error) else None)
        raise
    finally:
        if viewers is not None:
            viewers.close()
        try:
            folding.close()  # every batch folded before the manifest says what the fold counted
        finally:
            if progress is not None:
                progress.write()  # the final counts, for the requests the manifest does not count
            ending = ending_of(result) if result is not None else broken
            unwritten = recorder.close(replace(ending, run=ran[-1]) if ran else ending)
            if unwritten is not None and directory.is_dir():  # the folder turned read-only: say what it holds
                if result is not None:
                    what = f"the job {result.status}, but the manifest in {directory}"
                elif broken.reason:  # the error that stopped the session already names the folder
                    what = f"{broken.reason}; the manifest"
                else:
                    what = f"the session was {broken.status}, and the manifest in {directory}"
                raise RecordingError(
                    f"{what} could not be updated ({unwritten}): it still says running "
                    "(`meshtop summary` reads it as interrupted)"
                ) from None
    return result
