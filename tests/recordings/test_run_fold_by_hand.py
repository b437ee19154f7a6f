"""The run fold itself, against numbers worked out by hand: an endpoint's client CPU and server figures (from
tables and from events), the rows it leaves out, the ranks' starts (an elastic job's size, a restart's first
step), the GPUs a manifest names and a script's MFU, where a rank is, a completed step's bubbles before and
after it closes, what ``finish`` forgets, figures asked again after a change, the order ``fold_tables`` folds
kinds in, an interleaved pipeline's stages, how many steps it keeps, and a step that completes after the job
ended."""

from __future__ import annotations

import dataclasses

import pytest

from meshtop.probes.events import (
    Event,
    JobEnded,
    ProbeOff,
    ProcessSample,
    RankExited,
    RequestDone,
    ServerMetric,
    StageAction,
)
from meshtop.recordings.manifest import Endpoint, GpuInfo, Load, RunDescription
from meshtop.recordings.metrics.mfu import GpuModel
from meshtop.recordings.metrics.run import ClosedStep, RunFold, fold_tables
from meshtop.recordings.schema import table_of
from tests.kit.events import collective, fold_events, gpu_sample, rank_started, stage_action, step
from tests.kit.inference import BASE_NS, MS, served
from tests.kit.recordings import description, elastic_script

# -- an endpoint's client and server -------------------------------------------------------------------------


def process(rank: int, at_ms: float, cpu_pct: float | None) -> ProcessSample:
    return ProcessSample(
        rank=rank, pid=10 + rank, wall_ns=BASE_NS + int(at_ms * MS), cpu_pct=cpu_pct, rss_bytes=1, threads=1
    )


def sent(request: int, at_ms: float) -> RequestDone:
    """A request sent on time at ``at_ms``, its 2 tokens 10 and 20 ms later."""
    done = served(request, 0, at_ms, [at_ms + 10, at_ms + 20])
    return dataclasses.replace(done, scheduled_ns=done.arrival_ns)


def endpoint_run(load: Load | None = None) -> RunDescription:
    endpoint = Endpoint(url="http://127.0.0.1:8000/v1", api="completions", model="m")
    return dataclasses.replace(elastic_script(1), mode="infer", script=None, endpoint=endpoint, load=load)


def test_an_endpoints_client_cpu_is_its_rank_0s_samples_in_the_loads_window_and_its_server_has_figures() -> None:
    """Requests sent at 0 and 100 ms, the last ending at 120 ms: the window is 0 to 120 ms. The load generator
    (rank 0) read 40 % at 10 ms, no CPU at 50 ms, 60 % at 110 ms and 99 % at 500 ms (past the window): mean
    (40 + 60) / 2 = 50 %, max 60 %. One scrape of the server: its figures are there."""
    fold = RunFold(endpoint_run())
    fold.apply("request", table_of([sent(0, 0), sent(1, 100)]))
    fold.apply("process", table_of([process(0, 10, 40.0), process(0, 50, None), process(0, 110, 60.0)]))
    fold.apply("process", table_of([process(0, 500, 99.0)]))
    fold.apply(
        "server_metric",
        table_of([ServerMetric(wall_ns=1, name="vllm:num_requests_running", labels="", value=2.0, common="running")]),
    )
    figures = fold.figures()
    assert figures.requests is not None and figures.requests.client is not None
    client = figures.requests.client
    assert (client.cpu_mean_pct, client.cpu_max_pct) == (50.0, 60.0)
    assert figures.server is not None and figures.server.scrapes == 1


def test_a_built_in_serving_runs_rank_0_is_a_replica_not_the_client() -> None:
    """Built-in serving (no endpoint) whose requests say when they were planned: client figures, but rank 0's
    process samples are a replica's, not the load generator's: no client CPU."""
    fold = RunFold(description(mode="infer", dp=1))
    fold.apply("request", table_of([sent(0, 0), sent(1, 100)]))
    fold.apply("process", table_of([process(0, 10, 40.0)]))
    figures = fold.figures()
    assert figures.requests is not None and figures.requests.client is not None
    assert figures.requests.client.cpu_mean_pct is None
    assert figures.server is None


# -- rows left out -----------------------------------------------------------------------------------------


def test_a_step_table_leaves_out_negative_steps_and_a_collective_of_one_rank_is_kept() -> None:
    """dp 2: rank 1's step of -0.5 s is left out and counted; a collective in a group of 1 (a rank alone) is
    the job's."""
    fold = RunFold(description(dp=2))
    fold.apply("step", table_of([step(0, 0), step(1, 0, -0.5)]))
    fold.apply("collective", table_of([collective(0, 0, group_size=1)]))
    assert fold.rejected == {"step": 1}
    assert [(row.group, row.count) for row in fold.figures().collectives] == [("dp", 1)]


# -- the ranks' starts ---------------------------------------------------------------------------------------


def test_a_start_that_says_no_size_keeps_the_runs_and_a_restart_counts_its_steps_from_its_first() -> None:
    """An elastic script counted for 4 ranks. Ranks 0 and 1 report step 3 (of 4 expected) and step 5; the first
    start says no size (0): it is 4 ranks from step 0. The restart (1) says 2 ranks from step 5: step 5 has
    its 2 and completes; step 3 is still the first start's, short of 2 of its 4."""
    fold = RunFold(elastic_script(4))
    fold_events(fold, [step(0, 3), step(1, 3), step(0, 5), step(1, 5)])
    fold_events(fold, [rank_started(0, world_size=0)])
    assert fold.starts == {0: (4, 0)}
    assert fold.steps_completed == 0
    fold_events(fold, [rank_started(0, world_size=2, restart=1, first_step=5)])
    assert fold.starts == {0: (4, 0), 1: (2, 5)}
    assert fold.run.world_size == 2
    assert [job.step for job in fold.steps_since(0)] == [5]


def test_a_rank_is_where_its_start_said_else_where_the_plan_puts_it() -> None:
    """dp 2 x pp 2: the plan puts rank 1 at (pp 0, dp 1, tp 0); its start says pp 1, dp 0. Rank 2 said nothing:
    the plan's (1, 0, 0)."""
    fold = RunFold(description(dp=2, pp=2))
    fold_events(fold, [rank_started(1, pp_rank=1, dp_rank=0)])
    assert fold.position(1) == (1, 0, 0)
    assert fold.position(2) == fold.run.plan.coordinates(2) == (1, 0, 0)
    assert fold.run.plan.coordinates(1) == (0, 1, 0)


# -- GPUs and MFU --------------------------------------------------------------------------------------------


def test_the_gpus_a_manifest_names_give_a_scripts_mfu_its_peak() -> None:
    """A script of 1 rank on GPU 1 of node 0, an "NVIDIA A100-SXM4-80GB" at 400 W (312e12 FLOP/s in bf16); GPU 0
    read no name and is left out. The rank trains 100M parameters: 6 x 1e8 = 6e8 FLOPs a token. Steps of 4096
    tokens in 0.1 s: 40,960 tokens/s; MFU 40,960 x 6e8 / 312e12 = 2.4576e13 / 3.12e14 = 0.078769."""
    script = elastic_script(1)
    assert script.script is not None
    run = dataclasses.replace(
        script, device="cuda", dtype="bf16", script=dataclasses.replace(script.script, tokens_per_step=4096)
    )
    fold = RunFold(run)
    fold.know_gpus(
        [
            GpuInfo(gpu=0, name=None, memory_total_bytes=None),
            GpuInfo(gpu=1, name="NVIDIA A100-SXM4-80GB", memory_total_bytes=None, power_limit_w=400.0),
        ]
    )
    assert fold.gpu_models == {(0, 1): GpuModel("NVIDIA A100-SXM4-80GB", 400.0)}
    fold_events(fold, [rank_started(0, world_size=1, model_parameters=100_000_000)])
    fold_events(fold, [step(0, number, 0.1, tokens=4096) for number in range(3)])
    found = fold.figures().mfu
    assert (found.flops_per_token, found.peak_flops_per_s, found.gpus) == (6e8, 312e12, 1)
    assert found.value == pytest.approx(2.4576e13 / 3.12e14)


# -- stages and steps ----------------------------------------------------------------------------------------


def actions(rank: int, number: int, busy_ms: int) -> list[StageAction]:
    """Rank ``rank`` (stage ``rank``) busy ``busy_ms`` in step ``number``: a 1 ms forward, then a backward."""
    start = number * 10**9
    return [
        StageAction(rank=rank, step=number, stage=rank, microbatch=0, action=action, start_ns=begin, end_ns=end)
        for action, begin, end in (
            ("forward", start, start + MS),
            ("backward", start + MS, start + busy_ms * MS),
        )
    ]


BUSY_MS = {0: (6, 8), 1: (5, 10), 2: (4, 4), 3: (8, 2), 4: (3, 6)}
"""Per step, stage 0's and stage 1's busy ms (pp 2: rank 0 is stage 0, rank 1 stage 1)."""
FORWARD_BACKWARD_MS = {0: 10, 1: 20, 2: 4, 3: 16}
"""Per step, both ranks' forward + backward ms; step 4 has its actions but no step timing."""


def pipeline_events() -> list[Event]:
    """The stage actions of steps 0 to 4, then the step timings of steps 0 to 3."""
    events: list[Event] = []
    for number, busy in BUSY_MS.items():
        for rank, busy_ms in enumerate(busy):
            events += actions(rank, number, busy_ms)
    for number, fb_ms in FORWARD_BACKWARD_MS.items():
        events += [step(rank, number, 0.025, forward_backward_s=fb_ms / 1e3) for rank in range(2)]
    return events


def pipeline_fold() -> RunFold:
    """pp 2, the stage actions folded as a table, the steps as events (as the dashboard does)."""
    fold = RunFold(description(pp=2))
    events = pipeline_events()
    fold.apply("stage_action", table_of([event for event in events if event.kind == "stage_action"]))
    fold_events(fold, [event for event in events if event.kind == "step"])
    return fold


def test_a_steps_bubbles_are_as_closed_or_as_far_as_its_events_came_and_finish_forgets_the_incomplete() -> None:
    """span = max(forward + backward, busiest stage); a stage's bubble (span - busy) / span.
    Steps 0 to 3 complete; 0 and 1 close (2 behind step 3). Step 0: span 10, bubbles 4 / 10, 2 / 10; step 1:
    span 20, 15 / 20, 10 / 20. Step 3 completed, not closed: span 16, 8 / 16, 14 / 16. Step 4 never completes
    (no step timing): its stages alone, span 6, 3 / 6, 0. The job ends: step 3 closes as it was; step 4 and its
    all-reduce are forgotten."""
    fold = pipeline_fold()
    fold.apply("collective", table_of([collective(0, 4)]))
    assert fold.closed_count == 2
    assert fold.step_bubbles(0) == (pytest.approx(0.010), {0: pytest.approx(0.4), 1: pytest.approx(0.2)})
    assert fold.step_bubbles(1) == (pytest.approx(0.020), {0: pytest.approx(0.75), 1: pytest.approx(0.5)})
    assert fold.step_bubbles(3) == (pytest.approx(0.016), {0: pytest.approx(0.5), 1: pytest.approx(0.875)})
    assert fold.step_bubbles(4) == (pytest.approx(0.006), {0: pytest.approx(0.5), 1: pytest.approx(0.0)})
    fold.finish("completed")
    assert fold.closed_count == 4
    assert fold.step_bubbles(3) == (pytest.approx(0.016), {0: pytest.approx(0.5), 1: pytest.approx(0.875)})
    assert fold.step_bubbles(4) == (0.0, {})
    assert (fold.stages.open_steps(), fold.collectives.open_steps()) == ([], [])


def test_a_ranks_communication_in_its_closed_steps_is_what_attention_reads() -> None:
    """dp 2, 3 steps of 10 ms: each rank runs forward 0-4 ms and backward 4-8 ms; rank 0 then waits out a 2 ms
    all-reduce (8-10 ms): 2 ms of communication a step, rank 1 none (its last 2 ms are other). Medians over
    the closed steps 2 ms and 0; attention's median of the two 1 ms."""
    fold = RunFold(description(dp=2))
    fold.apply("collective", table_of([collective(0, n, 0.002, offset_ns=8 * MS, waited=True) for n in range(3)]))
    starts = [n * 10**9 for n in range(3)]  # step n starts at n s
    fold_events(
        fold,
        [
            step(rank, n, 0.010, phases="fb", phase_start_ns=(t, t + 4 * MS), phase_end_ns=(t + 4 * MS, t + 8 * MS))
            for n, t in enumerate(starts)
            for rank in range(2)
        ],
    )
    fold.finish("completed")
    assert fold.recent_by_rank.medians("communication") == {0: pytest.approx(0.002), 1: 0.0}
    assert fold.recent_by_rank.medians("data") == {0: 0.0, 1: 0.0}
    assert fold.attention("communication").median == pytest.approx(0.001)


def test_a_served_run_of_one_stage_has_no_stage_rows() -> None:
    """Serving with pp 1: an iteration that says it waited 2 ms of 10 is no pipeline stage's."""
    fold = RunFold(description(mode="infer", dp=1))
    fold.apply("step", table_of([step(0, 0, 0.010, pipeline_wait_s=0.002)]))
    assert fold.steps_completed == 1
    assert fold.figures().stages == ()


def test_figures_asked_again_after_the_job_ended_are_the_ended_jobs() -> None:
    """Figures asked before any event, after steps 0 to 3 (steps 0 and 1 closed: 2 stage spans each), after the
    end (steps 2 and 3 closed too: 4), and after a later empty batch: each time the figures of that moment."""
    fold = RunFold(description(pp=2))
    assert fold.figures().stages == ()
    events = pipeline_events()
    fold.apply("stage_action", table_of([event for event in events if event.kind == "stage_action"]))
    fold_events(fold, [event for event in events if event.kind == "step"])
    before = fold.figures().stages
    assert [row.stage for row in before] == [0, 1]
    # stage 0 busy (6 + 5) / 2 = 5.5 ms a step, idle (4 + 15) / 2 = 9.5 ms
    assert [row.busy_s for row in before] == [pytest.approx(0.0055), pytest.approx(0.009)]
    fold.finish("completed")
    fold_events(fold, [])
    # stage 0 busy (6 + 5 + 4 + 8) / 4 = 5.75 ms; step 2: span 4, idle 0 and 0; step 3: idle 8 and 14
    after = fold.figures().stages
    assert [row.busy_s for row in after] == [pytest.approx(0.00575), pytest.approx(0.006)]
    assert [row.idle_s for row in after] == [pytest.approx(0.00675), pytest.approx(0.0065)]


# -- fold_tables' order ------------------------------------------------------------------------------------


def test_fold_tables_folds_the_operations_before_the_steps_that_close_them_whatever_order_they_come_in() -> None:
    """pp 2, tables given steps first, then stage actions, then all-reduces (each 5 ms, waited out, in every
    step of both ranks). Folded in order, step 0 closes with its stage busy times and its operations: span
    10 ms, bubbles 0.4 and 0.2; each rank exposed 5 ms."""
    events = pipeline_events()
    steps = [event for event in events if event.kind == "step"]
    stage_actions = [event for event in events if event.kind == "stage_action"]
    operations = [collective(rank, number, 0.005, waited=True) for number in range(4) for rank in range(2)]
    fold = fold_tables(
        description(pp=2),
        [
            ("step", [table_of(steps)]),
            ("stage_action", [table_of(stage_actions)]),
            ("collective", [table_of(operations)]),
        ],
        status="completed",
    )
    first = fold.closed[0]
    assert first.step == 0
    assert (first.span_s, first.bubbles) == (pytest.approx(0.010), {0: pytest.approx(0.4), 1: pytest.approx(0.2)})
    assert first.exposed_by_rank == {0: pytest.approx(0.005), 1: pytest.approx(0.005)}


def test_fold_tables_folds_the_ranks_starts_first() -> None:
    """An elastic script counted for 2 ranks starts 4: rank 3's all-reduce, given before the starts, is the
    job's."""
    fold = fold_tables(
        elastic_script(2),
        [
            ("collective", [table_of([collective(3, 0)])]),
            ("rank_started", [table_of([rank_started(rank, world_size=4) for rank in range(4)])]),
        ],
        status="completed",
    )
    assert fold.rejected == {}
    assert [row.count for row in fold.figures().collectives] == [1]


# -- more: events as the dashboard folds them, what the fold keeps --------------------------------------------


def test_an_endpoints_client_cpu_taken_as_events_is_its_rank_0s_and_a_built_in_servings_is_none() -> None:
    """As the dashboard folds them (events, not tables). Endpoint: requests sent at 0 and 100 ms, the last
    ending at 120 ms; the load generator (rank 0) read 40 % at 10 ms, no CPU at 50 ms, 60 % at 110 ms and 99 %
    at 500 ms (past the window): mean (40 + 60) / 2 = 50 %, max 60 %. Built-in serving: rank 0 is a replica,
    its 40 % is no client's."""
    fold = RunFold(endpoint_run())
    fold_events(fold, [sent(0, 0), sent(1, 100)])
    fold_events(fold, [process(0, 10, 40.0), process(0, 50, None), process(0, 110, 60.0), process(0, 500, 99.0)])
    requests = fold.figures().requests
    assert requests is not None and requests.client is not None
    assert (requests.client.cpu_mean_pct, requests.client.cpu_max_pct) == (50.0, 60.0)

    built_in = RunFold(description(mode="infer", dp=1))
    fold_events(built_in, [sent(0, 0), sent(1, 100), process(0, 10, 40.0)])
    requests = built_in.figures().requests
    assert requests is not None and requests.client is not None
    assert requests.client.cpu_mean_pct is None


def test_an_endpoints_requests_left_when_the_job_ended_were_not_sent_and_its_gpus_and_end_are_not_the_servers() -> None:
    """An endpoint's load of 3 requests; 1 reported, a GPU sampled, a scrape, then the job ends (interrupted),
    each as an event: the 2 requests without a report were never sent (not failed): count 1, not sent 2. The
    GPU sample and the end are the fold's, not the server's."""
    load = Load(
        requests=3,
        concurrency=1,
        request_rate_per_s=None,
        prompt_len=(8, 8),
        output_len=(2, 2),
        max_batch=1,
        seed=0,
    )
    fold = RunFold(endpoint_run(load))
    metric = ServerMetric(wall_ns=1, name="vllm:num_requests_running", labels="", value=2.0, common="running")
    sampled = gpu_sample(
        wall_ns=BASE_NS,
        name="NVIDIA H100 80GB HBM3",
        memory_used_bytes=1,
        memory_total_bytes=2,
        utilization_pct=50.0,
        power_limit_w=700.0,
    )
    fold_events(fold, [sent(0, 0), sampled, metric])
    fold_events(fold, [JobEnded(wall_ns=BASE_NS + 50 * MS, status="interrupted", duration_s=1.0, root_cause_rank=None)])
    figures = fold.figures()
    assert figures.requests is not None
    assert (figures.requests.count, figures.requests.not_sent, figures.requests.failed) == (1, 2, 0)
    assert figures.requests.failures == ()
    assert figures.requests.completed == 1
    assert len(figures.gpus) == 1
    assert figures.server is not None and figures.server.scrapes == 1


# -- an interleaved pipeline ---------------------------------------------------------------------------------


def test_an_interleaved_pipelines_later_stages_are_their_ranks_pipeline_stages() -> None:
    """pp 2 with interleaved stages (the runner's: stage index modulo pp): rank 0 runs stage 2 for 3 ms, rank 1
    stage 3 for 5 ms; they are pipeline stages 0 and 1. No step timing yet: the span is the busiest stage,
    5 ms; bubbles (5 - 3) / 5 = 0.4 and 0."""
    fold = RunFold(description(pp=2))
    fold.apply(
        "stage_action",
        table_of(
            [
                StageAction(rank=0, step=0, stage=2, microbatch=0, action="forward", start_ns=0, end_ns=3 * MS),
                StageAction(rank=1, step=0, stage=3, microbatch=0, action="forward", start_ns=0, end_ns=5 * MS),
            ]
        ),
    )
    assert fold.step_bubbles(0) == (pytest.approx(0.005), {0: pytest.approx(0.4), 1: pytest.approx(0.0)})


# -- steps kept ----------------------------------------------------------------------------------------------


def test_a_fold_keeps_the_last_4096_completed_steps() -> None:
    """A served run's 4097 iterations of rank 0: all count, the last 4096 (steps 1 to 4096) are kept."""
    fold = RunFold(description(mode="infer", dp=1))
    fold_events(fold, [step(0, number, 0.01) for number in range(4097)])
    assert fold.steps_completed == 4097
    kept = fold.steps_since(0)
    assert (len(kept), kept[0].step, kept[-1].step) == (4096, 1, 4096)


def test_a_fold_keeps_the_last_240_closed_steps_each_with_its_ranks_times() -> None:
    """One rank, 243 steps of 0.1 s; the job ends and all 243 close: the last 240 (steps 3 to 242) are kept,
    each with its step time and rank 0's."""
    fold = RunFold(description(dp=1))
    fold_events(fold, [step(0, number, 0.1) for number in range(243)])
    fold.finish("completed")
    assert fold.closed_count == 243
    assert (len(fold.closed), fold.closed[0].step, fold.closed[-1].step) == (240, 3, 242)
    last = fold.closed[-1]
    assert last.duration_s == pytest.approx(0.1)
    assert last.rank_durations_s == {0: pytest.approx(0.1)}


# -- rows counted as not the job's ---------------------------------------------------------------------------


def test_rows_of_ranks_outside_the_job_are_counted_across_tables_and_a_step_of_no_time_is_kept() -> None:
    """dp 2 (ranks 0 and 1): two step tables, each with a row of a rank outside (5, then 7): 2 counted. Rank 2,
    the world size itself, is outside too (1 more). A step of 0 s is the job's. A probe that was off is no
    figure's: its table is not checked or counted. A rank outside the job that exited is counted (1 more);
    rank 1's exit, code 1, is followed."""
    fold = RunFold(description(dp=2))
    fold.apply("step", table_of([step(0, 0), step(5, 0)]))
    fold.apply("step", table_of([step(0, 1), step(7, 1)]))
    assert fold.rejected == {"step": 2}
    assert len(fold.of_the_job("step", table_of([step(2, 2)]))) == 0
    fold_events(fold, [step(2, 2)])
    assert fold.rejected == {"step": 3}
    assert len(fold.of_the_job("step", table_of([step(1, 0, 0.0)]))) == 1
    fold.apply("probe_off", table_of([ProbeOff(rank=5, wall_ns=0, probe="loss", reason="off")]))
    assert fold.rejected == {"step": 3}
    exits = [RankExited(rank=rank, wall_ns=0, exit_code=1, signal=None, error=None) for rank in (5, 1)]
    fold.apply("rank_exited", table_of(exits))
    assert fold.rejected == {"step": 3, "rank_exited": 1} and fold.exits == {1: 1}


# -- a step completed after the end --------------------------------------------------------------------------


def test_a_step_completed_after_the_job_ended_closes_without_its_ranks_spans() -> None:
    """An elastic script counted for 2 ranks: rank 0 reports step 0 (0.1 s), the job ends (step 0 incomplete,
    its spans forgotten), then the ranks' start says there was 1 rank: step 0 completes, and closes at the
    next end with its step time but no rank's span (nothing left of it): no rank times, span 0."""
    fold = RunFold(elastic_script(2))
    fold_events(fold, [step(0, 0, 0.1)])
    fold.finish("completed")
    assert fold.closed_count == 0
    fold_events(fold, [rank_started(0, world_size=1)])
    assert fold.steps_completed == 1
    fold.finish("completed")
    assert list(fold.closed) == [ClosedStep(0, pytest.approx(0.1), {}, {}, {}, 0.0, {})]


def test_an_event_of_no_rank_is_the_jobs_whatever_its_size_says() -> None:
    """The job's end names no rank: it is the job's even while the job is counted at no rank yet (an elastic
    job's size before its ranks say it): not refused."""
    fold = RunFold(elastic_script(0))
    fold_events(fold, [JobEnded(wall_ns=5, status="completed", duration_s=1.0, root_cause_rank=None)])
    assert fold.rejected == {}


# -- issue 48's mutation run ---------------------------------------------------------------------------------


def test_figures_asked_between_two_tables_and_again_after_the_end_count_both_steps() -> None:
    """dp 1: step 0 folded (1 step), the figures asked; step 1 folded (2), the job ended; the figures then count 2
    steps, not the 1 of the figures asked before (the end moves the fold on, never back to a version seen)."""
    fold = RunFold(description(dp=1))
    fold.apply("step", table_of([step(0, 0)]))
    assert fold.figures().steps.count == 1
    fold.apply("step", table_of([step(0, 1)]))
    fold.finish("completed")
    assert fold.figures().steps.count == 2


def test_a_gpu_sample_that_read_an_empty_name_names_no_model() -> None:
    """GPU 0's first sample read the name "" (NVML gave none), its second "NVIDIA H100 80GB HBM3" at 700 W: the
    model is the second's, not an empty one kept as the first."""
    fold = RunFold(description(dp=1, device="cuda", dtype="bf16"))
    samples = [
        gpu_sample(gpu=0, wall_ns=1, name="", power_limit_w=None),
        gpu_sample(gpu=0, wall_ns=2, name="NVIDIA H100 80GB HBM3", power_limit_w=700.0),
    ]
    fold.apply("gpu", table_of(samples))
    assert fold.gpu_models == {(0, 0): GpuModel("NVIDIA H100 80GB HBM3", 700.0)}


def test_a_training_run_has_no_request_figures_and_its_tokens_come_from_its_steps() -> None:
    """dp 1, one step of 8 tokens in 0.1 s: no requests were sent, so no request figures (not a load's of 0), and
    the step's own rate, 80 tokens/s."""
    fold = RunFold(description(dp=1))
    fold.apply("step", table_of([step(0, 0, 0.1, tokens=8)]))
    figures = fold.figures()
    assert figures.requests is None
    assert figures.steps.tokens_per_s == pytest.approx(80.0)


def test_a_batch_torn_before_any_report_tears_step_0_only() -> None:
    """dp 1: the first batch came without its bulk kinds and held only the start, so step 0's work may be what
    was left out (a rank sends a step's work before its report): step 0 closes torn, step 1 whole (1 of 2)."""
    fold = RunFold(description(dp=1))
    fold.apply_torn([("rank_started", table_of([rank_started(0, world_size=1)]))])
    fold.apply("step", table_of([step(0, 0)]))
    fold.apply("step", table_of([step(0, 1)]))
    fold.finish("completed")
    assert (fold.closed_count, fold.closed_torn) == (2, 1)


def test_a_stage_action_of_no_stage_is_left_out_and_counted() -> None:
    """pp 2: rank 0's forward of stage -1 (no stage) is not the job's: left out and counted, 1 of the 2."""
    fold = RunFold(description(pp=2))
    fold.apply("stage_action", table_of([stage_action(0, 0, stage=-1), stage_action(0, 0, stage=0)]))
    assert fold.rejected == {"stage_action": 1}


def test_a_served_runs_tokens_per_s_are_its_requests_output_not_its_iterations() -> None:
    """Built-in serving: requests 0 (tokens at 20, 30, 40 ms) and 1 (one token at 70 ms), arrivals at 0 and
    10 ms: 4 output tokens over the window 0 to 70 ms, 4 / 0.07 = 57.1 tokens/s. Its one iteration says 64
    tokens in 10 ms (6,400 a second): the run's rate, and its MFU's, is the requests' output."""
    fold = RunFold(description(mode="infer", dp=1))
    fold.apply("request", table_of([served(0, 0, 0, [20, 30, 40]), served(1, 0, 10, [70])]))
    fold.apply("step", table_of([step(0, 0, 0.010, tokens=64)]))
    figures = fold.figures()
    assert figures.requests is not None and figures.requests.output_tokens_per_s == pytest.approx(4 / 0.07)
    assert figures.steps.tokens_per_s == pytest.approx(4 / 0.07)
