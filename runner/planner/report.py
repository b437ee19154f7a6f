"""A plan report: the planner's predictions held against the devices (memory that fits, links, bandwidth).

:mod:`meshtop.runner.planner.plans` predicts what each plan holds and moves; this module says what that means on the
machines at hand: whether the most loaded rank fits in ``--device-memory`` and its headroom, where each
group's ranks sit and which tp group crosses a slow link, and how long the predicted collectives take at a
bus bandwidth. :func:`report` is the plain data ``meshtop plan --json`` prints and a sweep keeps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from meshtop.recordings.predictions import PlanPrediction, PlanReport
from meshtop.recordings.typed_json import dump
from meshtop.runner.errors import PlanError
from meshtop.runner.plan import ResolvedRun
from meshtop.runner.planner.plans import Candidate, Prediction, Question, in_flight


@dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    """Which ranks each group of one dim spans, and the warnings about where they sit."""

    groups: dict[str, list[list[int]]]
    warnings: list[str]


def placement(run: ResolvedRun, *, ranks_per_node: int, slow_pairs: Iterable[tuple[int, int]] = ()) -> Placement:
    """The dp / tp / pp groups of ``run`` as rank lists; a warning where a tp group crosses a node boundary
    or a GPU pair without NVLink (``slow_pairs``, local GPU indices), since tp all-reduces every layer."""
    spans: dict[str, dict[tuple[int, int], list[int]]] = {"pp": {}, "dp": {}, "tp": {}}
    for rank in range(run.plan.world_size):
        pp, dp, tp = run.plan.coordinates(rank)
        spans["tp"].setdefault((pp, dp), []).append(rank)
        spans["dp"].setdefault((pp, tp), []).append(rank)
        spans["pp"].setdefault((dp, tp), []).append(rank)
    groups = {dim: list(found.values()) for dim, found in spans.items() if len(next(iter(found.values()))) > 1}
    warnings = []
    slow = {tuple(sorted(pair)) for pair in slow_pairs}
    for ranks in groups.get("tp", []):
        nodes = sorted({rank // ranks_per_node for rank in ranks})
        if len(nodes) > 1:
            warnings.append(f"tp group {_ranks(ranks)} spans nodes {', '.join(map(str, nodes))}: keep tp within a node")
            continue
        local = [rank % ranks_per_node for rank in ranks]
        crossing = [(a, b) for i, a in enumerate(local) for b in local[i + 1 :] if (min(a, b), max(a, b)) in slow]
        if crossing:
            a, b = crossing[0]
            warnings.append(f"tp group {_ranks(ranks)}: GPUs {a} and {b} have no NVLink between them")
    return Placement(groups=groups, warnings=warnings)


def _ranks(ranks: list[int]) -> str:
    return "{" + ",".join(map(str, ranks)) + "}"


def comm_seconds(prediction: Prediction, busbw_bytes_per_s: float) -> float:
    """Predicted seconds of collectives per step on the busiest rank: each op's bytes over the bus bandwidth,
    times nccl-tests' bus factor (``t = S x factor / busbw``)."""
    from meshtop.recordings.metrics.bandwidth import bus_factor

    per_rank: dict[int, float] = {}
    for traffic in prediction.traffic:
        factor = bus_factor(traffic.op, traffic.group_size) or 1.0
        per_rank[traffic.rank] = per_rank.get(traffic.rank, 0.0) + traffic.bytes * factor / busbw_bytes_per_s
    return max(per_rank.values(), default=0.0)


def compute_seconds(run: ResolvedRun, flops_per_s: float) -> float:
    """Predicted compute seconds per step of one rank at ``flops_per_s`` achieved: the step's training FLOPs
    (6 N per token plus attention, :func:`meshtop.recordings.metrics.mfu.flops_per_token`) and what activation
    checkpointing computes again (the hardware's FLOPs, not MFU's: full repeats the forward but each block's
    last matmul, ``2 N - 2 h f L`` a token, since torch stops a recomputation once every saved tensor is back;
    selective the feed-forward's w1 and w3, ``4 h f L``), shared by every rank."""
    from meshtop.recordings.metrics.mfu import flops_per_token, looked_up_parameters

    shape = run.shape
    looked_up = looked_up_parameters(vocab_size=shape.vocab_size, dim=shape.dim, tie_embeddings=shape.tie_embeddings)
    per_token = flops_per_token(
        parameters=shape.parameter_count(), n_layers=shape.n_layers, dim=shape.dim, seq_len=run.seq_len,
        looked_up=looked_up,
    )  # fmt: skip
    mlp = 2 * shape.dim * shape.ffn_dim * shape.n_layers  # one of the feed-forward's three matmuls
    if run.checkpoint == "full":
        per_token += per_token / 3 - mlp
    elif run.checkpoint == "selective":
        per_token += 2 * mlp
    return per_token * run.batch_size * run.seq_len / run.plan.world_size / flops_per_s


SIZE_UNITS = {"": 1, "b": 1} | {
    unit: scale
    for power, prefix in enumerate("kmgt", 1)
    for unit, scale in ((f"{prefix}ib", 1 << 10 * power), (f"{prefix}b", 1000**power), (prefix, 1 << 10 * power))
}
"""Bytes of each unit, lower case: KiB and a bare K are binary, as device memory is counted; KB is decimal."""


def parse_size(text: str, *, flag: str = "--device-memory") -> int:
    """``80GiB``, ``80GB``, ``80G`` (binary), ``1.5TiB`` or plain bytes."""
    stripped = text.strip().lower().replace(" ", "")
    number = stripped.rstrip("kmgtib")
    unit = stripped[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in SIZE_UNITS or not 1 <= value * SIZE_UNITS.get(unit, 0) < float("inf"):
        raise PlanError(f"{flag} {text!r}: give a size such as 80GiB, 80GB or 85899345920")
    return int(value * SIZE_UNITS[unit])


@dataclass(frozen=True, kw_only=True, slots=True)
class Budget:
    """What the report measures plans against."""

    device_memory_bytes: int | None = None
    busbw_bytes_per_s: float | None = None
    flops_per_s: float | None = None
    """Achieved FLOP/s per device, for the step-time share of communication."""
    ranks_per_node: int | None = None
    slow_pairs: tuple[tuple[int, int], ...] = ()


def check_budget(budget: Budget, *, mode: str) -> None:
    """What the plans are timed with: rates above 0, given for a training step's collectives only, and the
    achieved FLOP/s only beside the bus bandwidth whose time they are compared with."""
    for flag, value in (("--busbw", budget.busbw_bytes_per_s), ("--tflops", budget.flops_per_s)):
        if value is not None and not 0 < value < float("inf"):
            raise PlanError(f"{flag} must be above 0")
    if budget.busbw_bytes_per_s is None and budget.flops_per_s is None:
        return
    if mode == "infer":
        raise PlanError(
            "--busbw, --tflops and --from time a training step's collectives: leave them out with --mode infer"
        )
    if budget.busbw_bytes_per_s is None:
        raise PlanError(
            "--tflops gives the step-time share of the communication that --busbw times: give "
            "--busbw too (or --from REC, a recording with collectives)"
        )


def misfit(prediction: Prediction, device_memory_bytes: int | None) -> str | None:
    """``the predicted peak of rank 3, 92.4 GiB, above the device's 79.2 GiB``: where the most loaded rank must
    hold more (:attr:`~meshtop.runner.planner.plans.Prediction.peak_fit_bytes`) than one device's memory;
    ``None`` where it fits, or no device memory is known."""
    if device_memory_bytes is None or prediction.peak_fit_bytes <= device_memory_bytes:
        return None
    peak, device = size_words(prediction.peak_fit_bytes), size_words(device_memory_bytes)
    return f"the predicted peak of rank {prediction.peak.rank}, {peak}, above the device's {device}"


def size_words(count: int) -> str:
    """``92.4 GiB``; under a tenth of a GiB (a small model's on CPU ranks) ``7.7 MiB``, which GiB would round
    to 0."""
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 / 10 else f"{count / 2**20:.1f} MiB"


REFUSED = ("key", "runs", "reason")
"""What the report says of a plan that cannot run: why, and nothing else."""


def report(question: Question, found: list[Candidate], budget: Budget) -> dict[str, object]:
    """The plan report as plain data: ``meshtop plan --json`` prints it, the text view and the sweep read it
    (:class:`~meshtop.recordings.predictions.PlanReport`)."""
    first = next((c.prediction.run for c in found if c.prediction is not None), None)
    plans = tuple(
        plan_prediction(candidate.label, candidate.prediction, budget)
        if candidate.prediction is not None
        else PlanPrediction(key=candidate.label, runs=False, reason=candidate.reason)
        for candidate in found
    )
    whole = PlanReport(
        model=first.shape.counted() if first is not None else None,
        ranks=question.ranks,
        device="cuda" if question.gpus else "cpu",
        mode=question.base.mode,
        dtype=first.dtype if first is not None else question.base.dtype,
        precision=first.precision if first is not None else question.base.precision,
        checkpoint=first.checkpoint if first is not None else question.base.checkpoint,
        batch_size=first.batch_size if first is not None and first.mode == "train" else None,
        seq_len=first.seq_len if first is not None else None,
        device_memory_bytes=budget.device_memory_bytes,
        busbw_bytes_per_s=budget.busbw_bytes_per_s,
        flops_per_s=budget.flops_per_s,
        plans=plans,
    )
    data: dict[str, Any] = dump(whole)
    data["plans"] = [row if row["runs"] else {key: row[key] for key in REFUSED} for row in data["plans"]]
    return data


def plan_prediction(key: str, prediction: Prediction, budget: Budget) -> PlanPrediction:
    """One plan that runs: its predictions, held against the budget where one was given."""
    run, peak = prediction.run, prediction.peak
    memory_cap = budget.device_memory_bytes
    ranks_per_node = budget.ranks_per_node or run.plan.world_size
    where = placement(run, ranks_per_node=ranks_per_node, slow_pairs=budget.slow_pairs)
    comm = compute = share = None
    if budget.busbw_bytes_per_s and run.mode == "train":
        comm = comm_seconds(prediction, budget.busbw_bytes_per_s)
        if budget.flops_per_s:
            compute = compute_seconds(run, budget.flops_per_s)
            share = comm / (comm + compute) if comm + compute > 0 else None
    return PlanPrediction(
        key=key,
        runs=True,
        reason=None,
        label=run.plan.label,
        dp=run.plan.dp,
        tp=run.plan.tp,
        pp=run.plan.pp,
        fsdp=run.plan.fsdp,
        schedule=run.plan.schedule,
        microbatches=run.microbatches if run.plan.pp > 1 else None,
        virtual_stages=run.plan.virtual_stages,
        in_flight=tuple(len(in_flight(run, pp_rank)) for pp_rank in range(run.plan.pp))
        if run.mode == "train"
        else None,
        peak_rank=peak.rank,
        peak=peak,
        ranks=prediction.memory,
        fits=None if memory_cap is None else prediction.peak_fit_bytes <= memory_cap,
        headroom_bytes=None if memory_cap is None else memory_cap - prediction.peak_fit_bytes,
        traffic=prediction.traffic,
        step_bytes={f"{group} {op}": nbytes for (group, op), nbytes in sorted(prediction.step_bytes().items())},
        groups={dim: tuple(tuple(ranks) for ranks in spans) for dim, spans in where.groups.items()},
        warnings=tuple(where.warnings),
        group_nodes={
            dim: tuple(tuple(sorted({rank // ranks_per_node for rank in ranks})) for ranks in spans)
            for dim, spans in where.groups.items()
        },
        comm_s=comm,
        compute_s=compute,
        comm_share=share,
    )
