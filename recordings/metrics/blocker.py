"""What blocks a training run: the one limit to lift before any other tuning, with the figures that show it
and what to try.

The rule, over a run's figures (:class:`~meshtop.recordings.metrics.figures.RunFigures`) and its ranks'
errors, the first that holds:

1. **fit**: a rank failed out of memory (its error matches :data:`OUT_OF_MEMORY`). Nothing else matters
   while the job does not fit. The planner's prediction is no part of a recording: ``run`` and ``record``
   refuse before launch a built-in plan predicted not to fit the device's memory (``blocker: fit`` with
   :data:`SUGGESTIONS`' fit), and a sweep runs only the plans that fit, so a recording's fit rests on what
   its ranks ran into.
2. No closed step: nothing to judge (``None``).
3. Of the step's parts **beyond compute** (compute: forward + backward + optimizer, the model's own work),
   in :data:`BEYOND_COMPUTE` order: **data** (waiting for the next batch), **communication** (exposed: what
   the ranks waited in collectives, not what overlapped compute) and **bubble** (a pipelined rank idle
   between its stage actions), the one of the largest share of the step (of equal shares, the first) is
   the blocker where its share is at least :data:`MATERIAL_SHARE`; else **compute**: none of them is worth
   a change of layout.

   The shares are the step breakdown's (:mod:`~meshtop.recordings.metrics.breakdown`: every rank's closed
   steps, each moment of a step in one part). Where no rank measured its phases (a script not
   instrumented for phases, ``--no-instrument``) there is no breakdown, and the rule falls back to what
   the run still measured: where the probes saw collectives, communication is the exposed share of those
   outside the pipeline group (:func:`~meshtop.recordings.metrics.collectives.communication_share` of the
   rows whose group is not ``pp``, 0 where there are none: a pipeline's sends and receives are its bubble,
   as in the breakdown), at their mean exposed seconds per step summed; bubble is the run's mean bubble
   (:func:`~meshtop.recordings.metrics.pipeline.mean_bubble`: of the schedule's span, the step less its
   optimizer, so a little above its share of the whole step), at the stages' mean idle seconds per step;
   data is not measured and is left out. Where none of the three is known (no collectives, no stages and
   no breakdown), there is nothing to judge (``None``).

The evidence says the blocker's share of the step and its seconds per step, and the other parts'
shares beside it: ``bubble 25 % of the step (399.1 ms a step), the largest beyond compute (data not
measured, communication 6 %)``.

What blocks a serving run (a run with requests: an endpoint's load, or the built-in model's inference),
the first that holds, over its request figures
(:class:`~meshtop.recordings.metrics.requests.RequestFigures`), the server's scraped figures where it
published them (:class:`~meshtop.recordings.metrics.server.ServerFigures`) and what failed:

1. **fit**: the model and its KV cache do not fit: a rank (the built-in model's) or the server meshtop
   started failed out of memory (:data:`OUT_OF_MEMORY` in its error, or in why the server failed and its
   log's last lines); the server preempted a request (its ``preemptions`` counter grew: a request was
   evicted from a full KV cache and is computed again); its KV cache reached :data:`FULL_CACHE`; or a
   request failed out of memory (:data:`OUT_OF_MEMORY` in its error).
2. No completed request: nothing to judge (``None``).
3. **client**: the load generator limited the run (an endpoint's client figures say why:
   :func:`~meshtop.recordings.metrics.requests.client_figures`, its send lag or its CPU). The achieved rate
   beside the asked one is evidence, not a rule of its own: with every request sent on time the achieved
   rate is the seeded plan's, whose spread from the asked rate is the arrivals' chance, not the client's.
4. **queue**: the waiting requests grow through the run: the server's ``requests_waiting`` gauge over the
   last third of its scrapes while the load was sent (a backlog drains after it) averages at least
   :data:`QUEUE_FLOOR` and at least :data:`QUEUE_GROWTH` times its first third's (from 3 scrapes on; fewer
   tell no trend). Where the server published no such gauge
   (the built-in model, a server without ``/metrics``), the requests tell instead: TTFT p50 over the last
   third of the completed requests by arrival at least :data:`TTFT_RISE` times the first third's (above 0)
   while TPOT p50 holds (the last third's at most :data:`TPOT_HOLD` times the first's, or no TPOT: one-token
   answers): the answers start later while each decodes as fast, so the time went to waiting.
5. **latency** or **queue**: TPOT is high (its p90 above the SLO's TPOT: more than a tenth of the answers
   decode slower than allowed; without a TPOT objective its p50 above :data:`TPOT_LIMIT_S`), or else the
   SLO is missed (met by under :data:`ATTAINMENT` of the load's requests). With nothing waiting (the
   waiting gauge's mean under :data:`QUEUE_FLOOR`; without the gauge, the requests' rule of 4 did not
   hold, all that is known) **latency**: an answer's own work, its decode or its prefill, is too slow.
   With a standing queue (the gauge's mean at least :data:`QUEUE_FLOOR`, a backlog that does not grow: a
   closed loop's concurrency above what the server batches) **queue**: each server holds more than it
   batches, and a batch's TPOT grows with its size.
6. **none**: the SLO met by at least :data:`ATTAINMENT` of the requests, or no SLO set and no limit above
   found.

The evidence names the figures with their numbers: ``requests waiting grew from 0.30 on average over the
first third of the scrapes while the load was sent to 6.20 over the last (at least 1 and 2 x the first)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from meshtop.recordings.metrics.collectives import communication_share
from meshtop.recordings.metrics.figures import RunFigures
from meshtop.recordings.metrics.pipeline import mean_bubble
from meshtop.recordings.metrics.requests import RequestFigures

MATERIAL_SHARE = 0.10
"""A part beyond compute blocks the run where it takes at least this share of the step: a tenth of the step
is what a change of layout (more loader workers, a larger bucket, more microbatches) can win back at best,
and below it the run-to-run spread of a step on a shared machine is of the same size, so a change would
not show."""
OUT_OF_MEMORY = re.compile(
    r"out of memory|OutOfMemoryError|can't allocate memory|No available memory for the cache blocks"
    r"|available KV cache memory|stored in KV cache|Not enough memory"
)
"""An error that says it ran out of memory: CUDA's ``CUDA out of memory. Tried to allocate ...``, torch's
exception ``torch.OutOfMemoryError`` by name, the CPU allocator's ``DefaultCPUAllocator: can't allocate
memory``; and a serving engine's at its start, where the weights leave its KV cache too little: vLLM's ``No
available memory for the cache blocks``, ``... larger than the available KV cache memory`` and ``... larger
than the maximum number of tokens that can be stored in KV cache``, SGLang's ``Not enough memory``."""
BEYOND_COMPUTE = ("data", "communication", "bubble")
"""The step's parts that are not the model's own work, in the order a tie is broken: the breakdown's
order."""
COMPUTE = ("forward", "backward", "optimizer")
"""The model's own work."""
SUGGESTIONS = {
    "fit": "make the most loaded rank fit: shard more (FSDP, a larger tp or pp), a smaller microbatch, "
    "activation checkpointing or a lower precision; `meshtop plan --device-memory` checks a layout before launch",
    "data": "more DataLoader workers (num_workers) and prefetch (prefetch_factor, pin_memory), so that the next "
    "batch is ready when the step asks for it",
    "communication": "overlap it with compute: a larger DDP bucket (bucket_cap_mb) or FSDP's forward and backward "
    "prefetch; or keep the largest group within the fastest links",
    "bubble": "more microbatches, or an interleaved schedule (virtual stages), to fill the pipeline",
    "compute": "nothing to fix in the parallel layout: the step is the model's own work",
}
"""What to try, per kind of a training run."""
FULL_CACHE = 0.95
"""A server's KV cache this full (its largest share over the scrapes) blocks the run by its fit: the engine
admits a request only with blocks for it, so at 95 % the next long answer waits or evicts another (vLLM
preempts there), and the last 5 % is a few requests' blocks on any cache."""
QUEUE_FLOOR = 1.0
"""Requests waiting on average, over the last third of the scrapes, from which a queue holds the run: below
one, most scrapes saw none waiting, and a request that waited did so for less than a scrape's interval."""
QUEUE_GROWTH = 2.0
"""The last third's mean waiting at least this many times the first third's: a queue that grows through the
run (a rate above what the server takes grows its backlog linearly, so the last third holds some five times
the first), not one that wavers about a level near capacity (its thirds differ by chance, by less)."""
TTFT_RISE = 2.0
"""Without the server's waiting gauge, TTFT p50 over the last third of the requests at least this many times
the first third's: the answers start twice as late as the load goes on, far beyond the prompts' own spread
(the seeded prompt lengths are spread alike over the thirds)."""
TPOT_HOLD = 1.25
"""TPOT holds while TTFT rises when the last third's TPOT p50 is at most this many times the first's: the
decode is as fast (a fuller batch decodes a little slower), so the later first token is time spent waiting,
not working."""
TPOT_LIMIT_S = 0.100
"""A TPOT p50 above this is high where the load set no TPOT objective: 100 ms a token is 10 tokens a second
an answer, about twice a reader's pace (some 4 words a second, 1.3 tokens a word); slower and a streamed
answer falls behind the eye reading it."""
ATTAINMENT = 0.95
"""The share of the load's requests that must meet the SLO for the run to meet it (guidellm's goodput and
meshtop's sweep alike): the SLO is a promise about nearly every request, and 1 in 20 missing it is what a
p95 objective allows."""
SERVING_SUGGESTIONS = {
    "fit": "give the model and its KV cache more memory: tensor parallel over more GPUs, a smaller or quantised "
    "model, a shorter maximum length (max-model-len) or fewer requests at once (max-num-seqs); vLLM's "
    "gpu-memory-utilization leaves the cache more of each GPU",
    "client": "give the load generator room (a core of its own, nothing else busy on its machine) or ask a lower "
    "rate: this run measured the client, not the server",
    "queue": "more replicas (a second server sharing the load), or a lower rate: the server takes fewer requests "
    "a second than this load asks",
    "latency": "tensor parallel over the fastest links (NVLink) to split each answer's work, or a smaller or "
    "quantised model",
    "none": "nothing blocks at this load: a higher rate finds where the SLO stops holding",
}
"""What to try, per kind of a serving run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Blocker:
    """What blocks a run, the figures that show it, and what to try."""

    kind: str
    """Training: fit, data, communication, bubble or compute; serving: fit, client, queue, latency or none."""
    evidence: str
    suggestion: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "evidence": self.evidence, "suggestion": self.suggestion}


Part = tuple[float, float]
"""A part's share of the step and its seconds per step."""


def blocker_of(
    figures: RunFigures, errors: Mapping[int, str | None], server_failure: Sequence[str] = ()
) -> Blocker | None:
    """What blocks the run of ``figures`` by the module's rules, a training run's or a serving run's
    (``errors``: each rank's error, where it failed; ``server_failure``: why the server meshtop started
    failed and its log's last lines, where it failed); ``None`` where the rule judges nothing."""
    if figures.requests is not None:
        return serving_blocker(figures, figures.requests, errors, server_failure)
    out_of_memory = sorted(rank for rank, error in errors.items() if error and OUT_OF_MEMORY.search(error))
    if out_of_memory:
        first = out_of_memory[0]
        ranks = ", ".join(map(str, out_of_memory))
        evidence = f"rank{'s' * (len(out_of_memory) > 1)} {ranks} failed out of memory: {errors[first]}"
        return Blocker(kind="fit", evidence=evidence, suggestion=SUGGESTIONS["fit"])
    if not figures.steps.count:
        return None
    parts = step_parts(figures)
    if not parts:
        return None
    kind = max(parts, key=lambda part: parts[part][0])
    share, seconds = parts[kind]
    if share < MATERIAL_SHARE:
        return Blocker(kind="compute", evidence=compute_evidence(figures, parts), suggestion=SUGGESTIONS["compute"])
    others = ", ".join(part_words(part, parts) for part in BEYOND_COMPUTE if part != kind)
    evidence = f"{kind} {percent(share)} of the step{per_step(seconds)}, the largest beyond compute ({others})"
    return Blocker(kind=kind, evidence=evidence, suggestion=SUGGESTIONS[kind])


def step_parts(figures: RunFigures) -> dict[str, Part]:
    """The known parts beyond compute (of :data:`BEYOND_COMPUTE`): the breakdown's, else the fallback of the
    module's rule."""
    breakdown = figures.breakdown
    if breakdown is not None:
        return {part: (breakdown.parts[part]["share"], breakdown.parts[part]["s_per_step"]) for part in BEYOND_COMPUTE}
    parts: dict[str, Part] = {}
    if figures.collectives:
        outside = [row for row in figures.collectives if row.group != "pp"]
        exposed = [row.exposed_per_step_s for row in outside if row.exposed_per_step_s is not None]
        parts["communication"] = (communication_share(outside) or 0.0, sum(exposed))
    if (bubble := mean_bubble(figures.stages)) is not None:
        parts["bubble"] = (bubble, sum(row.idle_s for row in figures.stages) / len(figures.stages))
    return parts


def compute_evidence(figures: RunFigures, parts: Mapping[str, Part]) -> str:
    """``data 2 %, communication 5 %, bubble 0 % of the step: each under 10 %; forward, backward and optimizer
    85 % (212.0 ms a step)`` (the compute part where the breakdown has it)."""
    said = ", ".join(part_words(part, parts) for part in BEYOND_COMPUTE)
    evidence = f"{said} of the step: each under {percent(MATERIAL_SHARE)}"
    breakdown = figures.breakdown
    if breakdown is not None:
        share = sum(breakdown.parts[part]["share"] for part in COMPUTE)
        seconds = sum(breakdown.parts[part]["s_per_step"] for part in COMPUTE)
        evidence += f"; forward, backward and optimizer {percent(share)}{per_step(seconds)}"
    return evidence


def part_words(part: str, parts: Mapping[str, Part]) -> str:
    """``communication 6 %``, or ``data not measured``."""
    return f"{part} {percent(parts[part][0])}" if part in parts else f"{part} not measured"


def percent(share: float) -> str:
    """``25 %`` (a share, rounded to a whole percent)."""
    return f"{share:.0%}".replace("%", " %")


def per_step(seconds: float) -> str:
    """`` (399.1 ms a step)``."""
    return f" ({seconds * 1e3:.1f} ms a step)"


def serving_blocker(
    figures: RunFigures, requests: RequestFigures, errors: Mapping[int, str | None], server_failure: Sequence[str]
) -> Blocker | None:
    """What blocks a serving run by the module's serving rule."""
    if (fit := serving_fit(figures, requests, errors, server_failure)) is not None:
        return Blocker(kind="fit", evidence=fit, suggestion=SERVING_SUGGESTIONS["fit"])
    if not requests.completed:
        return None
    if (client := requests.client) is not None and client.limited is not None:
        evidence = client.limited
        if client.achieved_rate_per_s is not None and client.asked_rate_per_s is not None:
            evidence += f" (sent {client.achieved_rate_per_s:.2f} requests/s of {client.asked_rate_per_s:g} asked)"
        return Blocker(kind="client", evidence=evidence, suggestion=SERVING_SUGGESTIONS["client"])
    if (growth := queue_grows(figures, requests)) is not None:
        return Blocker(kind="queue", evidence=growth, suggestion=SERVING_SUGGESTIONS["queue"])
    server = figures.server
    waiting = server.gauges.get("requests_waiting") if server is not None else None
    mean = waiting["mean"] if waiting is not None else None
    waited = f"requests waiting {mean:.2f} on average" if mean is not None else ttft_thirds(requests)
    latencies = f"TTFT p90 {ms_or_none(requests.latencies['ttft_s']['p90'])}, TPOT p90 {ms_or_none(tpot_p90(requests))}"
    problem = tpot_high(requests) or slo_missed(requests, latencies)
    if problem is not None and mean is not None and mean >= QUEUE_FLOOR:
        evidence = f"{problem} with a standing queue ({waited})"
        return Blocker(kind="queue", evidence=evidence, suggestion=SERVING_SUGGESTIONS["queue"])
    if problem is not None:
        evidence = f"{problem} with nothing waiting ({waited})"
        return Blocker(kind="latency", evidence=evidence, suggestion=SERVING_SUGGESTIONS["latency"])
    if requests.slo_met is not None:
        said = slo_words(requests, requests.slo_met, "at least")
    else:
        said = "no SLO set and no limit found"
    return Blocker(kind="none", evidence=f"{said}: {latencies}, {waited}", suggestion=SERVING_SUGGESTIONS["none"])


def queue_grows(figures: RunFigures, requests: RequestFigures) -> str | None:
    """The evidence that the waiting requests grow through the run (rule 4 of the serving rule: the server's
    waiting gauge's thirds, or without the gauge TTFT rising while TPOT holds); ``None`` where they do not.
    What blocks a run and whether a capacity sweep's run is saturated
    (:mod:`~meshtop.recordings.capacity`) both read it, so the two never disagree on a growing queue."""
    server = figures.server
    waiting = server.gauges.get("requests_waiting") if server is not None else None
    thirds = server.thirds.get("requests_waiting") if server is not None else None
    if thirds is not None:
        first, last = thirds
        if last >= QUEUE_FLOOR and last >= QUEUE_GROWTH * first:
            return (
                f"requests waiting grew from {first:.2f} on average over the first third of the scrapes while the "
                f"load was sent to {last:.2f} over the last (at least {QUEUE_FLOOR:g} and {QUEUE_GROWTH:g} x the first)"
            )
        return None
    return ttft_rise(requests) if waiting is None else None


def tpot_p90(requests: RequestFigures) -> float | None:
    return requests.latencies["tpot_s"]["p90"]


def tpot_high(requests: RequestFigures) -> str | None:
    """``TPOT p90 80.0 ms above the SLO's 50.0 ms`` (or its p50 above :data:`TPOT_LIMIT_S` without a TPOT
    objective); ``None`` where TPOT is not high."""
    objective = requests.slo.tpot_s
    if objective is not None:
        p90 = tpot_p90(requests)
        return f"TPOT p90 {ms(p90)} above the SLO's {ms(objective)}" if p90 is not None and p90 > objective else None
    p50 = requests.latencies["tpot_s"]["p50"]
    if p50 is not None and p50 > TPOT_LIMIT_S:
        return f"TPOT p50 {ms(p50)} above {ms(TPOT_LIMIT_S)} (no TPOT objective set)"
    return None


def slo_missed(requests: RequestFigures, latencies: str) -> str | None:
    """``SLO met by 80 % of the requests (under 95 %; TTFT <= 500 ms): TTFT p90 ..., TPOT p90 ...``; ``None``
    where the SLO was met or none was set."""
    met = requests.slo_met
    if met is None or met >= ATTAINMENT:
        return None
    return f"{slo_words(requests, met, 'under')}: {latencies}"


def slo_words(requests: RequestFigures, met: float, than: str) -> str:
    """``SLO met by 80 % of the requests (under 95 %; TTFT <= 500 ms)``."""
    return f"SLO met by {percent(met)} of the requests ({than} {percent(ATTAINMENT)}; {requests.slo.describe()})"


def serving_fit(
    figures: RunFigures, requests: RequestFigures, errors: Mapping[int, str | None], server_failure: Sequence[str]
) -> str | None:
    """The evidence that the model and its cache do not fit (rule 1 of the serving rule); ``None`` where none
    holds."""
    out_of_memory = sorted(rank for rank, error in errors.items() if error and OUT_OF_MEMORY.search(error))
    if out_of_memory:
        return f"rank {out_of_memory[0]} failed out of memory: {errors[out_of_memory[0]]}"
    if said := next((line for line in server_failure if OUT_OF_MEMORY.search(line)), None):
        return f"the server failed out of memory: {said}"
    server = figures.server
    if server is not None and (preempted := server.counters.get("preemptions", 0.0)) > 0:
        return f"the server preempted {preempted:g} requests: its KV cache was full, and they were computed again"
    if server is not None and (cache := server.gauges.get("kv_cache_usage")) is not None:
        fullest = cache["max"]
        if fullest is not None and fullest >= FULL_CACHE:
            return f"the server's KV cache reached {percent(fullest)} (at least {percent(FULL_CACHE)})"
    failed = [(reason, count) for reason, count in requests.failures if OUT_OF_MEMORY.search(reason)]
    if failed:
        count = sum(count for _, count in failed)
        return f"{count} request{'s' * (count > 1)} failed out of memory: {failed[0][0]}"
    return None


def ttft_rise(requests: RequestFigures) -> str | None:
    """The evidence that TTFT rose with the load while TPOT held (rule 4 without the server's gauge); ``None``
    where it did not."""
    ttft = requests.thirds.get("ttft_s")
    if ttft is None or not ttft[1] >= TTFT_RISE * ttft[0] > 0:
        return None
    tpot = requests.thirds.get("tpot_s")
    if tpot is not None and tpot[1] > TPOT_HOLD * tpot[0]:
        return None
    held = f"TPOT p50 held ({ms(tpot[0])} to {ms(tpot[1])}, within {TPOT_HOLD:g} x)" if tpot is not None else "no TPOT"
    return (
        f"TTFT p50 rose from {ms(ttft[0])} over the first third of the requests to {ms(ttft[1])} over the last "
        f"(at least {TTFT_RISE:g} x) while {held}"
    )


def ttft_thirds(requests: RequestFigures) -> str:
    """``TTFT p50 224.0 ms over the first third of the requests, 138.1 ms over the last``: what is known of a
    queue without the server's gauge."""
    ttft = requests.thirds.get("ttft_s")
    if ttft is None:
        return "no waiting gauge, and too few requests for thirds"
    return f"TTFT p50 {ms(ttft[0])} over the first third of the requests, {ms(ttft[1])} over the last"


def ms(seconds: float) -> str:
    """``38.8 ms``."""
    return f"{seconds * 1e3:.1f} ms"


def ms_or_none(seconds: float | None) -> str:
    return ms(seconds) if seconds is not None else "none"
