"""The planner: every way to spread a model over N ranks, with each rank's memory and each step's traffic.

Pure arithmetic over the model's shape and the plan: nothing here imports
torch, so ``meshtop plan`` answers an 8-billion-parameter question in
milliseconds. Each prediction mirrors what the built-in runner does
(:mod:`meshtop.runner.rank.train`, :mod:`meshtop.runner.rank.serve`), not an idealised framework, so a
sweep can check every figure against its recording; docs/planner.md gives
the formulas, their sources and the assumptions they make.

Plans are enumerated as :class:`meshtop.runner.plan.RunSpec` and resolved by the same
:func:`meshtop.runner.plan.resolve` that guards a launch, so a plan the runner would
refuse is listed with the runner's own reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from meshtop.recordings.manifest import ModelShape
from meshtop.recordings.predictions import PredictedTraffic, RankPrediction
from meshtop.runner.errors import PlanError
from meshtop.runner.plan import ResolvedRun, RunSpec, check_mode_options, check_positive, model_shape, resolve

ELEMENT_BYTES = {"fp32": 4, "bf16": 2}
FLOAT32 = 4
INDEX = 8
"""Token ids are int64."""
STEP_COUNTER = 4
"""AdamW keeps one float32 ``step`` scalar per parameter tensor."""
SWEEP_STEPS = 10
"""Steps a sweep runs of each plan unless told otherwise: a short measured window."""


@dataclass(frozen=True, slots=True)
class Matrix:
    """One parameter tensor as a rank holds it after tensor parallelism: ``rows x cols`` elements."""

    rows: int
    cols: int = 1


def chunk_rows(rows: int, parts: int, index: int) -> int:
    """Rows of part ``index`` when ``rows`` are cut as ``torch.chunk`` cuts them (FSDP2's dim-0 shards)."""
    size = padded_rows(rows, parts)
    return max(0, min(size, rows - index * size))


def padded_rows(rows: int, parts: int) -> int:
    """Rows of every FSDP2 shard once padded to equal size (what its all-gather moves per rank)."""
    return -(-rows // parts)


def layer_matrices(shape: ModelShape, tp: int) -> list[Matrix]:
    """One block's parameters on a rank: q / k / v and w1 / w3 split by output row, wo and w2 by input column."""
    h, d = shape.dim, shape.head_dim
    return [
        Matrix(h),
        Matrix(h),  # attention_norm, ffn_norm: replicated
        Matrix(shape.n_heads * d // tp, h),
        Matrix(shape.n_kv_heads * d // tp, h),
        Matrix(shape.n_kv_heads * d // tp, h),
        Matrix(h, shape.n_heads * d // tp),
        Matrix(shape.ffn_dim // tp, h),
        Matrix(shape.ffn_dim // tp, h),
        Matrix(h, shape.ffn_dim // tp),
    ]


@dataclass(frozen=True, slots=True)
class Unit:
    """A group of parameters that FSDP2 gathers and reduces together: one block, or a chunk's root (its ends)."""

    kind: str
    """``block`` or ``root``."""
    matrices: tuple[Matrix, ...]


def chunk_units(run: ResolvedRun, stage: int) -> list[Unit]:
    """The FSDP units of pipeline stage ``stage`` (the whole model without a pipeline), root first."""
    shape, tp = run.shape, run.plan.tp
    first, last = stage == 0, stage == run.plan.num_stages - 1
    ends: list[Matrix] = []
    if first:
        ends.append(Matrix(shape.vocab_size // tp, shape.dim))
    if last:
        ends.append(Matrix(shape.dim))
        if not (first and shape.tie_embeddings):  # a tied output is the embedding itself
            ends.append(Matrix(shape.vocab_size // tp, shape.dim))
    blocks = [Unit("block", tuple(layer_matrices(shape, tp))) for _ in run.plan.stage_layers[stage]]
    return [Unit("root", tuple(ends)), *blocks]


def rank_memory(run: ResolvedRun, rank: int) -> RankPrediction:
    """What ``rank`` holds: its parameters (tp split, fsdp sharded), their gradients, AdamW's state, the
    activations saved for backward at the step's peak, and the KV cache when serving.

    Mixed precision (:mod:`meshtop.runner.rank.precision`): under FSDP2 the shards, their gradients and AdamW's
    moments are fp32; elsewhere the parameters and gradients are bf16 and the optimizer holds an fp32 copy of
    each parameter beside fp32 moments (4 + 8 bytes a parameter)."""
    pp_rank, dp_rank, _ = run.plan.coordinates(rank)
    e = ELEMENT_BYTES[run.parameter_dtype]
    matrices = [m for stage in run.plan.stages_of(pp_rank) for unit in chunk_units(run, stage) for m in unit.matrices]
    shard = run.plan.dp if run.plan.fsdp else 1
    elements = sum(chunk_rows(m.rows, shard, dp_rank if run.plan.fsdp else 0) * m.cols for m in matrices)
    weights = elements * e
    if run.mode == "infer":
        grads = optimizer = activations = recompute = 0
        kv_cache = kv_cache_bytes(run, pp_rank)
    else:
        grads, kv_cache = weights, 0
        optimizer = (3 * elements * FLOAT32 if run.master_weights else 2 * weights) + STEP_COUNTER * len(matrices)
        activations, recompute = activation_bytes(run, pp_rank), recompute_bytes(run)
    total = weights + grads + optimizer + activations + kv_cache
    return RankPrediction(
        rank=rank,
        weights_bytes=weights,
        grads_bytes=grads,
        optimizer_bytes=optimizer,
        activations_bytes=activations,
        kv_cache_bytes=kv_cache,
        total_bytes=total,
        recompute_bytes=recompute,
        fit_bytes=total + recompute,
    )


def kv_cache_bytes(run: ResolvedRun, pp_rank: int) -> int:
    """Keys and values of every slot at the longest sequence, for the rank's layers and kv heads:
    ``2 x slots x max_sequence x kv_heads / tp x head_dim x bytes`` per layer."""
    assert run.load is not None
    shape = run.shape
    layers = len(run.plan.stage_layers[pp_rank])
    per_layer = 2 * run.load.max_batch * run.load.max_sequence * (shape.n_kv_heads // run.plan.tp) * shape.head_dim
    return per_layer * layers * ELEMENT_BYTES[run.dtype]


def layer_activation_bytes(run: ResolvedRun, sequences: int) -> int:
    """Bytes one block saves for backward for ``sequences`` sequences, as its checkpointing leaves them
    (docs/planner.md derives each term).

    Per token: each RMSNorm keeps :func:`norm_bytes` (its float32 input, normalised input and rstd, and its
    output, the next linear's input); attention keeps q, k and v (repeated to the query heads), its output
    (4 a d / t) and a float32 log-sum-exp per head; the SwiGLU MLP keeps w1's and w3's outputs, silu's output
    and the product (4 f / t).
    ``full`` checkpointing keeps the block's input alone (h); ``selective`` keeps the attention half and the
    feed-forward's input (h) in place of the feed-forward's norm and MLP.
    """
    norm, attention, mlp = _block_parts(run)
    hidden = ELEMENT_BYTES[run.dtype] * run.shape.dim
    per_token = {
        "none": 2 * norm + attention + mlp,
        "selective": norm + attention + hidden,
        "full": hidden,
    }[run.checkpoint]
    return sequences * run.seq_len * per_token


def _block_parts(run: ResolvedRun) -> tuple[int, int, int]:
    """Bytes a token of one block saves in each RMSNorm, in attention and in the MLP, without checkpointing."""
    shape, t, e = run.shape, run.plan.tp, ELEMENT_BYTES[run.dtype]
    local_heads = shape.n_heads // t
    attention = 4 * local_heads * shape.head_dim * e + local_heads * FLOAT32
    return norm_bytes(run), attention, 4 * (shape.ffn_dim // t) * e


def norm_bytes(run: ResolvedRun) -> int:
    """Bytes a token of one RMSNorm saves: torch's CPU RMSNorm upcasts to float32 and keeps the float32 input
    and normalised input (``8 h``; in fp32 the input is the tensor it was given), a float32 rstd, and its
    output in the compute dtype (the next linear keeps it): ``8 h + h e + 4``, which is ``3 h e + 4`` in fp32.
    Measured with a saved-tensors hook on torch 2.13's CPU kernel; a fused GPU kernel may keep less."""
    return 2 * run.shape.dim * FLOAT32 + run.shape.dim * ELEMENT_BYTES[run.dtype] + FLOAT32


def recompute_bytes(run: ResolvedRun) -> int:
    """What one block's recomputation holds during its backward (a microbatch's): under ``full`` every tensor
    the block saves without checkpointing, under ``selective`` its feed-forward's; ``0`` without
    checkpointing."""
    if run.checkpoint == "none":
        return 0
    norm, attention, mlp = _block_parts(run)
    per_token = 2 * norm + attention + mlp if run.checkpoint == "full" else norm + mlp
    return run.microbatch_size * run.seq_len * per_token


def stage_activation_bytes(run: ResolvedRun, stage: int, sequences: int) -> int:
    """One forward of stage ``stage`` over ``sequences`` sequences: its blocks, the rotary tables, and the
    ends (token ids in, the final norm and the float32 log-softmax of the logits out).

    The rotary tables (cos and sin, float32) are kept once; under FSDP2's mixed precision each block's unit
    casts its floating inputs to bf16, so each block keeps its own bf16 copy instead."""
    shape = run.shape
    tokens = sequences * run.seq_len
    layers = len(run.plan.stage_layers[stage])
    tables = 2 * run.seq_len * (shape.head_dim // 2)
    rotary = layers * tables * ELEMENT_BYTES[run.dtype] if run.mixed and run.plan.fsdp else tables * FLOAT32
    total = layers * layer_activation_bytes(run, sequences) + rotary
    if stage == 0 and (run.plan.pp == 1 or run.plan.tp > 1):
        total += tokens * INDEX  # the ids (under tp, the vocabulary shard's masked copy of them)
    if stage == run.plan.num_stages - 1:
        total += tokens * norm_bytes(run)  # the final RMSNorm
        total += tokens * shape.vocab_size * FLOAT32  # the log-softmax of the logits
        total += tokens * INDEX if run.plan.pp == 1 else 0  # the targets
    return total


def batch_index_bytes(run: ResolvedRun, pp_rank: int) -> int:
    """A pipeline's token ids and targets: its schedule splits the rank's batch into microbatches as views of
    the whole, so the first stage's embedding (without tp) and the last stage's loss keep the storage of the
    rank's whole batch, ``m T 8`` bytes each, from the first forward on; ``0`` without a pipeline."""
    if run.plan.pp == 1:
        return 0
    stages = run.plan.stages_of(pp_rank)
    whole = run.microbatches * run.microbatch_size * run.seq_len * INDEX
    return whole * ((0 in stages and run.plan.tp == 1) + (run.plan.num_stages - 1 in stages))


def in_flight(run: ResolvedRun, pp_rank: int) -> list[int]:
    """The stage of each forward whose activations are alive at the rank's peak (one entry per microbatch):
    the most forwards not yet undone by their backward while the rank's schedule runs (:func:`_chunk_actions`).

    No pipeline: the one forward. GPipe: every microbatch. 1F1B (torch's 1B1F steady state): the
    ``min(m, p - stage)`` warm-up forwards. Interleaved 1F1B: torch's warm-up forwards plus the steady state's
    first forward (it runs a forward before each backward), at most ``v m``.
    """
    alive: list[int] = []
    peak: list[int] = []
    for kind, stage in _chunk_actions(run, pp_rank):
        if kind == "F":
            alive.append(stage)
            if len(alive) > len(peak):
                peak = list(alive)
        else:
            alive.remove(stage)  # the oldest forward of that stage: microbatches go back in order
    return peak


def activation_bytes(run: ResolvedRun, pp_rank: int) -> int:
    """Peak bytes saved for backward on a rank of pipeline rank ``pp_rank``."""
    sequences = run.microbatch_size
    forwards = sum(stage_activation_bytes(run, stage, sequences) for stage in in_flight(run, pp_rank))
    return forwards + batch_index_bytes(run, pp_rank)


def rank_traffic(run: ResolvedRun, rank: int) -> list[PredictedTraffic]:
    """The collectives ``rank`` issues in one training step, summed per op and group."""
    pp_rank, dp_rank, _ = run.plan.coordinates(rank)
    e = ELEMENT_BYTES[run.dtype]  # activations, and what FSDP2 gathers: the compute dtype
    gradient = ELEMENT_BYTES[run.parameter_dtype]  # what replication all-reduces and the tied ends sum
    reduced = FLOAT32 if run.mixed else e  # what FSDP2 reduce-scatters: its policy's reduce_dtype under mixed
    totals: dict[tuple[str, str], list[int]] = {}
    sizes = {"dp": run.plan.dp, "tp": run.plan.tp, "pp": run.plan.pp, "embedding": 2}

    def add(op: str, group: str, nbytes: int, count: int = 1) -> None:
        if count and sizes[group] > 1:
            entry = totals.setdefault((op, group), [0, 0])
            entry[0] += nbytes * count
            entry[1] += count

    local_stages = run.plan.stages_of(pp_rank)
    forwards = _chunk_actions(run, pp_rank)
    activation = run.microbatch_size * run.seq_len * run.shape.dim * e
    for stage in local_stages:
        passes = sum(1 for action in forwards if action == ("F", stage))
        layers = len(run.plan.stage_layers[stage])
        # Megatron-style tp as DTensor runs it: wo and w2 reduce their output in forward; q, k, v, w1 and w3
        # each reduce their input's gradient in backward (five, not two: they are separate column linears).
        # A recomputed block reduces wo's output again under full checkpointing; not w2's: torch stops a
        # recomputation once every saved tensor is back, and w2's reduced output is saved by nothing in it.
        again = 1 if run.checkpoint == "full" else 0
        add("all_reduce", "tp", activation, passes * layers * (2 + 5 + again))
        if stage == 0:
            add("all_reduce", "tp", activation, passes)  # the vocabulary-split embedding's output
        if stage == run.plan.num_stages - 1:
            logits = run.microbatch_size * run.seq_len * run.shape.vocab_size * e
            add("all_gather", "tp", logits, passes)  # the whole logits for the loss
            add("all_reduce", "tp", activation, passes)  # the output projection's input gradient
        if run.plan.pp > 1:
            if stage > 0:
                add("recv", "pp", activation, passes)
                add("send", "pp", activation, passes)
            if stage < run.plan.num_stages - 1:
                add("send", "pp", activation, passes)
                add("recv", "pp", activation, passes)
    if run.plan.dp > 1:
        for stage in local_stages:
            units = [unit for unit in chunk_units(run, stage) if unit.matrices]
            if run.plan.fsdp:
                for unit, (gathers, scatters) in zip(units, _fsdp_collectives(run, pp_rank, stage, units), strict=True):
                    flat = sum(padded_rows(m.rows, run.plan.dp) * m.cols for m in unit.matrices) * run.plan.dp
                    add("all_gather", "dp", flat * e, gathers)
                    add("reduce_scatter", "dp", flat * reduced, scatters)
            else:  # DDP's buckets, or replicate's one all-reduce per unit: every gradient once
                for unit in units:
                    add("all_reduce", "dp", sum(m.rows * m.cols for m in unit.matrices) * gradient)
    if run.plan.pp > 1 and run.shape.tie_embeddings and (pp_rank == 0 or pp_rank == run.plan.pp - 1):
        rows = run.shape.vocab_size // run.plan.tp
        local = chunk_rows(rows, run.plan.dp, dp_rank) if run.plan.fsdp else rows
        add("all_reduce", "embedding", local * run.shape.dim * gradient)
    if (
        run.plan.dp > 1 and not run.plan.fsdp and run.plan.tp == 1 and run.plan.pp == 1
    ):  # classic DDP: one op per bucket, not unit
        entry = totals.pop(("all_reduce", "dp"))
        totals[("all_reduce", "dp")] = [entry[0], ddp_buckets(entry[0])]
    return [
        PredictedTraffic(rank=rank, op=op, group=group, group_size=sizes[group], bytes=nbytes, count=count)
        for (op, group), (nbytes, count) in sorted(totals.items(), key=lambda item: (item[0][1], item[0][0]))
    ]


DDP_FIRST_BUCKET = 1 << 20
DDP_BUCKET = 25 << 20


def ddp_buckets(gradient_bytes: int) -> int:
    """Buckets DDP fills (its first 1 MiB, then 25 MiB each), approximately: parameters are not split."""
    if gradient_bytes <= DDP_FIRST_BUCKET:
        return 1
    return 1 + math.ceil((gradient_bytes - DDP_FIRST_BUCKET) / DDP_BUCKET)


def _chunk_actions(run: ResolvedRun, pp_rank: int) -> list[tuple[str, int]]:
    """This rank's forwards (``F``) and backwards (``B``) in the order its schedule runs them, by stage."""
    if run.plan.pp == 1:
        return [("F", 0), ("B", 0)]
    m, p, v = run.microbatches, run.plan.pp, run.plan.virtual_stages
    stage = pp_rank
    if run.plan.schedule == "gpipe":
        return [("F", stage)] * m + [("B", stage)] * m
    if run.plan.schedule == "1f1b":
        warmup = min(m, p - pp_rank)
        actions = [("F", stage)] * warmup
        for _ in range(m - warmup):
            actions += [("B", stage), ("F", stage)]
        return actions + [("B", stage)] * warmup
    per_round = m // max(1, m // p)
    warmup = min((v - 1) * per_round + 2 * (p - 1 - pp_rank), v * m)
    local = run.plan.stages_of(pp_rank)
    actions = [("F", local[(op // per_round) % v]) for op in range(warmup)]
    for op in range(warmup, v * m):
        actions.append(("F", local[(op // per_round) % v]))
        actions.append(("B", local[v - 1 - ((op - warmup) // per_round) % v]))
    for op in range(v * m, v * m + warmup):
        actions.append(("B", local[v - 1 - ((op - warmup) // per_round) % v]))
    return actions


def _fsdp_collectives(run: ResolvedRun, pp_rank: int, stage: int, units: list[Unit]) -> Iterator[tuple[int, int]]:
    """All-gathers and reduce-scatters per step of each FSDP2 unit of ``stage``, by following its state.

    A unit starts sharded. Forward all-gathers a sharded unit; a block reshards after forward, the root
    does not (FSDP2's default). Backward all-gathers a sharded unit; without a pipeline it then reshards
    and reduce-scatters its gradients; under torch's pipelining it stays unsharded and keeps its gradients
    until the step's last backward, when each unit reduce-scatters once.
    """
    actions = [kind for kind, at in _chunk_actions(run, pp_rank) if at == stage]
    for unit in units:
        sharded, gathers, scatters = True, 0, 0
        for kind in actions:
            if sharded:
                gathers += 1
                sharded = False
            if kind == "F" and unit.kind == "block":
                sharded = True
            elif kind == "B" and run.plan.pp == 1:
                sharded = True
                scatters += 1
        if run.plan.pp > 1:
            scatters += 1
        yield gathers, scatters


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    """Everything the planner says of one resolved plan."""

    run: ResolvedRun
    memory: tuple[RankPrediction, ...]
    traffic: tuple[PredictedTraffic, ...]
    """Training: per rank and step. Serving: none predicted (each op's rows depend on how the load batches)."""

    @property
    def peak(self) -> RankPrediction:
        """The most loaded rank (the first of equals)."""
        return max(self.memory, key=lambda memory: (memory.total_bytes, -memory.rank))

    @property
    def peak_fit_bytes(self) -> int:
        """What the most loaded rank must fit in the device's memory (:attr:`RankPrediction.fit_bytes`)."""
        assert self.peak.fit_bytes is not None  # the planner states it
        return self.peak.fit_bytes

    def step_bytes(self) -> dict[tuple[str, str], int]:
        """Bytes per (group, op) in one step, summed over ranks."""
        totals: dict[tuple[str, str], int] = {}
        for traffic in self.traffic:
            totals[(traffic.group, traffic.op)] = totals.get((traffic.group, traffic.op), 0) + traffic.bytes
        return totals


def predict(run: ResolvedRun) -> Prediction:
    memory = tuple(rank_memory(run, rank) for rank in range(run.plan.world_size))
    traffic = (
        () if run.mode == "infer" else tuple(t for rank in range(run.plan.world_size) for t in rank_traffic(run, rank))
    )
    return Prediction(run=run, memory=memory, traffic=traffic)


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """One plan: resolved with its prediction, or refused with the runner's reason."""

    label: str
    """Its key (:func:`plan_key`: ``dp2xtp2``), as ``--plans`` spells it."""
    prediction: Prediction | None
    reason: str | None = None


def factorizations(n: int) -> Iterator[tuple[int, int, int]]:
    """Every (dp, tp, pp) whose product is ``n``, dp-heavy first."""
    for tp in range(1, n + 1):
        if n % tp:
            continue
        for pp in range(1, n // tp + 1):
            if (n // tp) % pp == 0:
                yield n // (tp * pp), tp, pp


def plan_key(dp: int, tp: int, pp: int, fsdp: bool) -> str:
    """``dp2``, ``fsdp2xtp2``, ``tp2xpp2``...: the degrees above 1, as ``--plans`` spells them."""
    parts = [f"{'fsdp' if fsdp else 'dp'}{dp}"] if dp > 1 or (dp == 1 and tp == 1 and pp == 1) else []
    parts += [f"tp{tp}"] if tp > 1 else []
    parts += [f"pp{pp}"] if pp > 1 else []
    return "x".join(parts)


def parse_plan_key(text: str) -> tuple[int, int, int, bool]:
    """(dp, tp, pp, fsdp) of a ``--plans`` entry such as ``dp2xtp2`` or ``fsdp4``."""
    degrees: dict[str, int] = {}
    fsdp = False
    for part in text.strip().lower().split("x"):
        prefix = next((p for p in ("fsdp", "dp", "tp", "pp") if part.startswith(p)), None)
        number = part[len(prefix) :] if prefix is not None else ""
        dim = "dp" if prefix == "fsdp" else prefix
        if prefix is None or not number.isdigit() or int(number) < 1 or dim in degrees:
            raise PlanError(
                f"--plans entry {text!r}: write each degree once, as dp2 (or fsdp2), tp2, pp2, joined by x (dp2xtp2)"
            )
        degrees[str(dim)] = int(number)
        fsdp = fsdp or prefix == "fsdp"
    if fsdp and degrees["dp"] < 2:
        raise PlanError(f"--plans entry {text!r}: fsdp shards over dp ranks, so it needs a degree of 2 or more")
    return degrees.get("dp", 1), degrees.get("tp", 1), degrees.get("pp", 1), fsdp


@dataclass(frozen=True, kw_only=True, slots=True)
class Question:
    """What ``meshtop plan`` and ``sweep`` are asked: a base spec (model, lengths, batch, load) and ranks."""

    base: RunSpec
    ranks: int
    gpus: bool
    """Plan for GPUs (nccl, one per rank) rather than CPU ranks."""
    with_fsdp: bool = False
    """Also list each plan with dp >= 2 sharded by FSDP2."""
    plans: tuple[str, ...] = field(default=())
    """Only these plans (``--plans``), in this order."""


def check_counts(*, gpus: int | None, ranks: int | None, gpus_per_node: int | None) -> None:
    """The device counts a question is asked for: each given one at least 1."""
    for flag, value in (("--gpus", gpus), ("--ranks", ranks), ("--gpus-per-node", gpus_per_node)):
        check_positive(flag, value)


def default_batch(ranks: int) -> int:
    """The global batch every plan of a question shares unless one is given: 4 sequences per rank, which
    dp x microbatches (default 2 x pp) divides for every factorization."""
    return 4 * ranks


def candidates(question: Question) -> list[Candidate]:
    """Every plan of the question (or those ``--plans`` names), each resolved by the runner's own checks."""
    if question.plans:
        wanted = [parse_plan_key(key) for key in question.plans]
        for key, (dp, tp, pp, fsdp) in zip(question.plans, wanted, strict=True):
            if dp * tp * pp != question.ranks:
                raise PlanError(
                    f"--plans {key}: dp x tp x pp = {dp * tp * pp}, not the {question.ranks} ranks asked for"
                )
            if wanted.count((dp, tp, pp, fsdp)) > 1:
                raise PlanError(f"--plans names {plan_key(dp, tp, pp, fsdp)} twice: give each plan once")
    else:
        wanted = []
        for dp, tp, pp in factorizations(question.ranks):
            wanted.append((dp, tp, pp, False))
            if question.with_fsdp and dp > 1 and question.base.mode == "train":
                wanted.append((dp, tp, pp, True))
    base = question.base
    check_mode_options(base)
    model_shape(base.model, base.model_config)  # a bad --model-config is the question's error, not each plan's
    if base.mode == "train" and base.batch_size is None:
        base = replace(base, batch_size=default_batch(question.ranks))
    found = []
    for dp, tp, pp, fsdp in wanted:
        spec = replace(
            base,
            dp=dp,
            tp=tp,
            pp=pp,
            fsdp=fsdp,
            schedule=base.schedule if pp > 1 else None,
            microbatches=base.microbatches if pp > 1 else None,
        )
        key = plan_key(dp, tp, pp, fsdp)
        try:
            run = resolve(spec, gpus_visible=question.ranks if question.gpus else 0)
        except PlanError as error:
            found.append(Candidate(label=key, prediction=None, reason=str(error)))
            continue
        found.append(Candidate(label=key, prediction=predict(run)))
    reasons = {candidate.reason for candidate in found}
    if len(reasons) == 1 and None not in reasons and len(found) > 1:  # the question, not a plan, is wrong
        raise PlanError(str(reasons.pop()))
    return found
