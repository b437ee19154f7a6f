"""The inference workload of one rank: serve the load's requests with a KV cache.

A replica is the tp x pp ranks of one dp index. Its leader (pipeline stage 0,
tp rank 0) runs the scheduler: it releases arrivals, admits a waiting request
into a free cache slot (a prefill op: one forward over the prompt), or
decodes one token for every admitted request that is not already in the
pipeline (a decode op), with up to ``max_batch`` requests at once, refilling
a finished request's slot at once (continuous batching), greedy sampling.

Each op flows through the replica as in a pipeline: stage 0's tp ranks get it
from the leader (a broadcast of a small header and the input tokens), compute
their layers, and pass the hidden states to the next stage (P2P send to the
same tp index); the last stage turns logits into tokens and sends them back
to the leader. The leader keeps up to ``pp`` ops in flight, so while stage 1
computes op k, stage 0 already computes op k + 1, and a request has at most
one op in flight (its next token needs its last). With pp = 1 an op is done
when its forward returns.

Every rank reports each op as a step (its wall time since the previous op,
with the time it waited on a pipeline neighbour), and, instrumented, as a
stage action; the leader reports each request when it finishes.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from meshtop.probes.events import Event, RequestDone
from meshtop.probes.memory import local_numel
from meshtop.recordings.manifest import Load
from meshtop.runner.load import TokenRequest, replica_concurrency, replica_share, token_requests
from meshtop.runner.plan import ResolvedRun
from meshtop.runner.rank.kv_cache import KVCache
from meshtop.runner.rank.mesh import MeshCoordinates
from meshtop.runner.rank.model import Transformer, meta_transformer
from meshtop.runner.rank.pipeline import cut_stage
from meshtop.runner.rank.precision import TORCH_DTYPES
from meshtop.runner.rank.train import synchronize
from meshtop.runner.rank.weights import init_weights

STOP, PREFILL, DECODE = 0, 1, 2
OP_NAMES = {PREFILL: "prefill", DECODE: "decode"}
HEADER_FIELDS = 4
"""op, rows, tokens per row, op id; then one cache slot per row."""
IDLE_POLL_S = 0.05
"""Longest sleep of an idle leader between arrivals (it re-checks the clock after)."""


@dataclass(frozen=True, slots=True)
class Op:
    """One forward through the replica: a prompt into one slot, or one token for each of several slots."""

    kind: int
    id: int
    slots: tuple[int, ...]
    tokens_per_row: int

    def header(self, max_batch: int, device: torch.device) -> torch.Tensor:
        values = [self.kind, len(self.slots), self.tokens_per_row, self.id, *self.slots]
        return torch.tensor(values + [0] * (HEADER_FIELDS + max_batch - len(values)), dtype=torch.long, device=device)

    @classmethod
    def from_header(cls, header: torch.Tensor) -> Op:
        kind, rows, per_row, op_id, *rest = header.tolist()
        return cls(kind=kind, id=op_id, slots=tuple(rest[:rows]), tokens_per_row=per_row)


@dataclass(kw_only=True, slots=True)
class ServingJob:
    """This rank's part of its replica: its layers, its cache, and who its neighbours are."""

    run: ResolvedRun
    load: Load
    coords: MeshCoordinates
    device: torch.device
    model: Transformer
    cache: KVCache
    tp_group: dist.ProcessGroup
    pp_group: dist.ProcessGroup

    def global_rank(self, *, pp: int, tp: int) -> int:
        """The rank at stage ``pp``, tp index ``tp`` of this rank's replica."""
        return (pp * self.run.plan.dp + self.coords.dp) * self.run.plan.tp + tp

    @property
    def leader_rank(self) -> int:
        return self.global_rank(pp=0, tp=0)

    @property
    def previous_stage_rank(self) -> int:
        """The rank this one receives hidden states from (same tp index, one stage earlier)."""
        return self.global_rank(pp=self.coords.pp - 1, tp=self.coords.tp)

    @property
    def is_leader(self) -> bool:
        return self.coords.pp == 0 and self.coords.tp == 0

    @property
    def is_last_stage(self) -> bool:
        return self.coords.pp == self.run.plan.pp - 1

    def local_parameters(self) -> int:
        return sum(local_numel(p) for p in self.model.parameters())

    @torch.no_grad()
    def forward(self, op: Op, inputs: torch.Tensor) -> torch.Tensor:
        """Run this rank's layers for ``op`` over ``inputs`` (tokens on stage 0, else hidden states)."""
        if op.kind == PREFILL:
            for slot in op.slots:  # a reused slot starts empty; what it held before is masked out
                self.cache.free(slot)
        self.cache.begin(torch.tensor(op.slots, device=self.device), op.tokens_per_row)
        out = self.model(inputs, cache=self.cache)
        self.cache.commit()
        if self.run.plan.tp > 1:
            from meshtop.runner.rank.tensor_parallel import completed  # DTensor's import, only for tp

            out = completed(out)
        return out


def build_serving(run: ResolvedRun, *, mesh: DeviceMesh, coords: MeshCoordinates, device: torch.device) -> ServingJob:
    """This rank's stage of the model, tensor-parallel if asked, initialised as a single process would be."""
    assert run.load is not None, "an inference run has a load"
    model = meta_transformer(run.shape, TORCH_DTYPES[run.dtype])
    if run.plan.pp > 1:
        model = cut_stage(model, run=run, stage_index=coords.pp)
    if run.plan.tp > 1:
        from meshtop.runner.rank.tensor_parallel import apply_tensor_parallel  # DTensor's import, only for tp

        apply_tensor_parallel(model, tp_mesh=mesh["tp"])
    model.to_empty(device=device)
    model.tie_weights()  # to_empty gives a plain tied parameter a new one in each module; a last stage's own
    # copy of a tied output starts as the embedding (meshtop.runner.rank.weights), and inference never changes it
    init_weights(model, model=run.shape, seed=run.seed, device=device)
    model.eval()
    cache = KVCache(
        slots=run.load.max_batch, max_len=run.load.max_sequence, dtype=TORCH_DTYPES[run.dtype], device=device
    )
    return ServingJob(
        run=run,
        load=run.load,
        coords=coords,
        device=device,
        model=model,
        cache=cache,
        tp_group=mesh["tp"].get_group(),
        pp_group=mesh["pp"].get_group(),
    )


@dataclass(kw_only=True, slots=True)
class Serving:
    """A request admitted into a cache slot."""

    request: TokenRequest
    slot: int
    arrival_ns: int
    tokens: list[int] = field(default_factory=list)
    token_ns: list[int] = field(default_factory=list)
    in_flight: bool = True


class Scheduler:
    """The leader's view of its replica's load: arrivals, the waiting queue, the admitted requests."""

    def __init__(self, job: ServingJob, *, start_ns: int, emit: Callable[[Event], None]) -> None:
        self.job, self.emit = job, emit
        self.max_batch = job.load.max_batch
        share = replica_share(
            token_requests(job.load, vocab_size=job.run.shape.vocab_size),
            replica=job.coords.dp,
            replicas=job.run.plan.dp,
        )
        self.start_ns = start_ns
        self.upcoming: deque[TokenRequest] = deque(share)
        self.waiting: deque[tuple[TokenRequest, int]] = deque()
        self.active: dict[int, Serving] = {}
        self.free_slots = list(range(self.max_batch - 1, -1, -1))
        self.next_op_id = 0
        clients = replica_concurrency(job.load, replica=job.coords.dp, replicas=job.run.plan.dp)
        for _ in range(min(clients or 0, len(self.upcoming))):  # closed loop: every client sends its first
            self.waiting.append((self.upcoming.popleft(), start_ns))

    @property
    def done(self) -> bool:
        return not (self.upcoming or self.waiting or self.active)

    def release_arrivals(self, now_ns: int) -> None:
        """Open loop: requests whose arrival time has come join the queue, stamped with that time."""
        while self.upcoming and self.upcoming[0].offset_s is not None:
            arrival_ns = self.start_ns + int(self.upcoming[0].offset_s * 1e9)
            if arrival_ns > now_ns:
                break
            self.waiting.append((self.upcoming.popleft(), arrival_ns))

    def next_arrival_ns(self) -> int | None:
        if self.upcoming and self.upcoming[0].offset_s is not None:
            return self.start_ns + int(self.upcoming[0].offset_s * 1e9)
        return None

    def next_op(self) -> tuple[Op, torch.Tensor] | None:
        """Admit a waiting request if a slot is free (prefill first, as it sets time to first token),
        else one token for every admitted request not in flight; ``None`` if neither can go."""
        device = self.job.device
        if self.waiting and self.free_slots:
            request, arrival_ns = self.waiting.popleft()
            slot = self.free_slots.pop()
            self.active[slot] = Serving(request=request, slot=slot, arrival_ns=arrival_ns)
            op = Op(kind=PREFILL, id=self._op_id(), slots=(slot,), tokens_per_row=len(request.prompt))
            return op, torch.tensor([request.prompt], dtype=torch.long, device=device)
        ready = [s for s in self.active.values() if not s.in_flight]
        if not ready:
            return None
        for serving in ready:
            serving.in_flight = True
        op = Op(kind=DECODE, id=self._op_id(), slots=tuple(s.slot for s in ready), tokens_per_row=1)
        return op, torch.tensor([[s.tokens[-1]] for s in ready], dtype=torch.long, device=device)

    def _op_id(self) -> int:
        self.next_op_id += 1
        return self.next_op_id - 1

    def complete(self, op: Op, tokens: list[int], now_ns: int) -> None:
        """``op``'s tokens reached the leader: append them, and let finished requests go."""
        for slot, token in zip(op.slots, tokens, strict=True):
            serving = self.active[slot]
            serving.tokens.append(token)
            serving.token_ns.append(now_ns)
            serving.in_flight = False
            if len(serving.tokens) >= serving.request.output_len:
                self._finish(serving, now_ns)

    def _finish(self, serving: Serving, now_ns: int) -> None:
        del self.active[serving.slot]
        self.free_slots.append(serving.slot)
        request = serving.request
        self.emit(
            RequestDone(
                rank=self.job.coords.rank,
                replica=self.job.coords.dp,
                request=request.id,
                arrival_ns=serving.arrival_ns,
                first_token_ns=serving.token_ns[0],
                end_ns=now_ns,
                prompt_tokens=len(request.prompt),
                output_tokens=len(serving.tokens),
                token_ns=tuple(serving.token_ns),
                output_ids=tuple(serving.tokens),
                status="completed",
                error=None,
            )
        )
        if self.upcoming and self.upcoming[0].offset_s is None:  # closed loop: the client sends its next
            self.waiting.append((self.upcoming.popleft(), now_ns))


@dataclass(frozen=True, slots=True)
class OpTiming:
    """What a rank reports for one op: when it ended, and how long it waited for a neighbour before it."""

    op: Op
    start_ns: int
    end_ns: int
    wait_s: float


OnOp = Callable[[OpTiming], None]


def serve(job: ServingJob, *, emit: Callable[[Event], None], on_op: OnOp) -> None:
    """Run this rank's part of the replica until the leader has served every request of its share."""
    if job.is_leader:
        lead(job, emit=emit, on_op=on_op)
    else:
        follow(job, on_op=on_op)


def lead(job: ServingJob, *, emit: Callable[[Event], None], on_op: OnOp) -> None:
    scheduler = Scheduler(job, start_ns=time.time_ns(), emit=emit)
    outbox = Outbox(job)
    in_flight: deque[Op] = deque()
    wait_s = 0.0
    while not scheduler.done:
        scheduler.release_arrivals(time.time_ns())
        step = None if len(in_flight) >= job.run.plan.pp else scheduler.next_op()
        if step is None:
            if in_flight:  # the oldest op's tokens come back from the last stage
                waited = time.perf_counter()
                op = in_flight.popleft()
                tokens = receive_tokens(job, rows=len(op.slots))
                wait_s += time.perf_counter() - waited
                scheduler.complete(op, tokens, time.time_ns())
            else:
                arrival = scheduler.next_arrival_ns()
                if arrival is not None:
                    time.sleep(min(IDLE_POLL_S, max(0.0, (arrival - time.time_ns()) / 1e9)))
            continue
        op, inputs = step
        start_ns = time.time_ns()
        announce(job, op, inputs)
        out = job.forward(op, inputs)
        if job.run.plan.pp > 1:
            outbox.onward(op, out)
            in_flight.append(op)
        else:
            scheduler.complete(op, out[:, -1].argmax(dim=-1).tolist(), time.time_ns())
        synchronize(job.device)
        on_op(OpTiming(op, start_ns, time.time_ns(), wait_s))
        wait_s = 0.0
    stop = Op(kind=STOP, id=-1, slots=(), tokens_per_row=0)
    announce(job, stop, None)
    if job.run.plan.pp > 1:
        outbox.onward(stop, None)
    outbox.flush()


def announce(job: ServingJob, op: Op, inputs: torch.Tensor | None) -> None:
    """The leader tells stage 0's other tp ranks the op (header, then its input tokens)."""
    if job.run.plan.tp > 1:
        dist.broadcast(op.header(job.load.max_batch, job.device), src=job.leader_rank, group=job.tp_group)
        if inputs is not None:
            dist.broadcast(inputs, src=job.leader_rank, group=job.tp_group)


def follow(job: ServingJob, *, on_op: OnOp) -> None:
    """Every rank but the leader: take each op from the leader or the previous stage, compute, pass it on."""
    header = Op(kind=STOP, id=0, slots=(), tokens_per_row=0).header(job.load.max_batch, job.device)
    first = job.coords.pp == 0
    outbox = Outbox(job)
    while True:
        waited = time.perf_counter()
        if first:
            dist.broadcast(header, src=job.leader_rank, group=job.tp_group)
        else:
            dist.recv(header, src=job.previous_stage_rank, group=job.pp_group)
        op = Op.from_header(header)
        if op.kind == STOP:
            if not job.is_last_stage:
                outbox.onward(op, None)
            outbox.flush()
            return
        rows = len(op.slots)
        if first:
            inputs = torch.empty((rows, op.tokens_per_row), dtype=torch.long, device=job.device)
            dist.broadcast(inputs, src=job.leader_rank, group=job.tp_group)
        else:
            inputs = torch.empty(
                (rows, op.tokens_per_row, job.run.shape.dim), dtype=TORCH_DTYPES[job.run.dtype], device=job.device
            )
            dist.recv(inputs, src=job.previous_stage_rank, group=job.pp_group)
        wait_s = time.perf_counter() - waited
        start_ns = time.time_ns()
        out = job.forward(op, inputs)
        if not job.is_last_stage:
            outbox.onward(op, out)
        elif job.run.plan.pp > 1 and job.coords.tp == 0:
            outbox.send(out[:, -1].argmax(dim=-1), dst=job.leader_rank)
        synchronize(job.device)
        on_op(OpTiming(op, start_ns, time.time_ns(), wait_s if not first else 0.0))


MAX_SENDS_IN_FLIGHT = 4
"""Sends a stage leaves unwaited: two ops' headers and hidden states."""


class Outbox:
    """Sends that do not wait: the leader must be free to take tokens back while its last op is on its way
    (a blocking send could wait on a stage that is itself sending tokens to the leader)."""

    def __init__(self, job: ServingJob) -> None:
        self.job = job
        self._pending: deque[tuple[dist.Work, torch.Tensor]] = deque()

    def send(self, tensor: torch.Tensor, *, dst: int) -> None:
        work = dist.isend(tensor, dst=dst, group=self.job.pp_group)
        assert work is not None, "isend returns a handle"
        self._pending.append((work, tensor))  # the tensor must outlive its send
        # gloo's send works say they are completed only once waited on: beyond a few in flight, the oldest
        # is waited for (long written by then). Without that they piled up until the load ended, holding
        # their tensors, and the probe saw each send end only then.
        while self._pending and (len(self._pending) > MAX_SENDS_IN_FLIGHT or self._pending[0][0].is_completed()):
            self._pending.popleft()[0].wait()

    def onward(self, op: Op, hidden: torch.Tensor | None) -> None:
        """The op's header, then its hidden states, to the same tp index of the next stage."""
        peer = self.job.global_rank(pp=self.job.coords.pp + 1, tp=self.job.coords.tp)
        self.send(op.header(self.job.load.max_batch, self.job.device), dst=peer)
        if hidden is not None:
            self.send(hidden.contiguous(), dst=peer)

    def flush(self) -> None:
        while self._pending:
            self._pending.popleft()[0].wait()


def receive_tokens(job: ServingJob, *, rows: int) -> list[int]:
    tokens = torch.empty(rows, dtype=torch.long, device=job.device)
    dist.recv(tokens, src=job.global_rank(pp=job.run.plan.pp - 1, tp=0), group=job.pp_group)
    return tokens.tolist()
