"""More of the run fold against numbers worked out by hand: an endpoint's client CPU and end taken as events,
an interleaved pipeline's stages, how many steps it keeps, the rows it counts as not the job's, and a step
that completes after the job ended."""

from __future__ import annotations

import dataclasses

import pytest

from meshtop.probes.events import (
    GpuSample,
    JobEnded,
    ProcessSample,
    RankExited,
    RequestDone,
    ServerMetric,
    StageAction,
)
from meshtop.recordings.manifest import Endpoint, Load, RunDescription
from meshtop.recordings.metrics.run import ClosedStep, RunFold
from meshtop.recordings.schema import table_of
from tests.kit.events import rank_started, step
from tests.kit.inference import BASE_NS, MS, served
from tests.kit.recordings import description, elastic_script

# -- an endpoint's events ------------------------------------------------------------------------------------


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


def test_an_endpoints_client_cpu_taken_as_events_is_its_rank_0s_and_a_built_in_servings_is_none() -> None:
    """As the dashboard folds them (events, not tables). Endpoint: requests sent at 0 and 100 ms, the last
    ending at 120 ms; the load generator (rank 0) read 40 % at 10 ms, no CPU at 50 ms, 60 % at 110 ms and 99 %
    at 500 ms (past the window): mean (40 + 60) / 2 = 50 %, max 60 %. Built-in serving: rank 0 is a replica,
    its 40 % is no client's."""
    fold = RunFold(endpoint_run())
    fold.apply_events([sent(0, 0), sent(1, 100)])
    fold.apply_events([process(0, 10, 40.0), process(0, 50, None), process(0, 110, 60.0), process(0, 500, 99.0)])
    requests = fold.figures().requests
    assert requests is not None and requests.client is not None
    assert (requests.client.cpu_mean_pct, requests.client.cpu_max_pct) == (50.0, 60.0)

    built_in = RunFold(description(mode="infer", dp=1))
    built_in.apply_events([sent(0, 0), sent(1, 100), process(0, 10, 40.0)])
    requests = built_in.figures().requests
    assert requests is not None and requests.client is not None
    assert requests.client.cpu_mean_pct is None


def gpu_sample() -> GpuSample:
    return GpuSample(
        gpu=0,
        wall_ns=BASE_NS,
        name="NVIDIA H100 80GB HBM3",
        memory_used_bytes=1,
        memory_total_bytes=2,
        utilization_pct=50.0,
        memory_utilization_pct=None,
        power_w=None,
        sm_clock_mhz=None,
        temperature_c=None,
        pcie_tx_bytes_per_s=None,
        pcie_rx_bytes_per_s=None,
        nvlink_tx_bytes_per_s=None,
        nvlink_rx_bytes_per_s=None,
        power_limit_w=700.0,
    )


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
    fold.apply_events([sent(0, 0), gpu_sample(), metric])
    fold.apply_events([JobEnded(wall_ns=BASE_NS + 50 * MS, status="interrupted", duration_s=1.0, root_cause_rank=None)])
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
    fold.apply_events([step(0, number, 0.01) for number in range(4097)])
    assert fold.steps_completed == 4097
    kept = fold.steps_since(0)
    assert (len(kept), kept[0].step, kept[-1].step) == (4096, 1, 4096)


def test_a_fold_keeps_the_last_240_closed_steps_each_with_its_ranks_times() -> None:
    """One rank, 243 steps of 0.1 s; the job ends and all 243 close: the last 240 (steps 3 to 242) are kept,
    each with its step time and rank 0's."""
    fold = RunFold(description(dp=1))
    fold.apply_events([step(0, number, 0.1) for number in range(243)])
    fold.finish("completed")
    assert fold.closed_count == 243
    assert (len(fold.closed), fold.closed[0].step, fold.closed[-1].step) == (240, 3, 242)
    last = fold.closed[-1]
    assert last.duration_s == pytest.approx(0.1)
    assert last.rank_durations_s == {0: pytest.approx(0.1)}


# -- rows counted as not the job's ---------------------------------------------------------------------------


def test_rows_of_ranks_outside_the_job_are_counted_across_tables_and_a_step_of_no_time_is_kept() -> None:
    """dp 2 (ranks 0 and 1): two step tables, each with a row of a rank outside (5, then 7): 2 counted. Rank 2,
    the world size itself, is outside too (1 more). A step of 0 s is the job's. A rank that exited is no
    figure's: its table is not checked or counted."""
    fold = RunFold(description(dp=2))
    fold.apply("step", table_of([step(0, 0), step(5, 0)]))
    fold.apply("step", table_of([step(0, 1), step(7, 1)]))
    assert fold.rejected == {"step": 2}
    assert not fold.of_the_job(step(2, 2))
    assert fold.apply_events([step(2, 2)]) == []
    assert fold.rejected == {"step": 3}
    assert fold.of_the_job(step(1, 0, 0.0))
    fold.apply("rank_exited", table_of([RankExited(rank=5, wall_ns=0, exit_code=1, signal=None, error=None)]))
    assert fold.rejected == {"step": 3}


# -- a step completed after the end --------------------------------------------------------------------------


def test_a_step_completed_after_the_job_ended_closes_without_its_ranks_spans() -> None:
    """An elastic script counted for 2 ranks: rank 0 reports step 0 (0.1 s), the job ends (step 0 incomplete,
    its spans forgotten), then the ranks' start says there was 1 rank: step 0 completes, and closes at the
    next end with its step time but no rank's span (nothing left of it): no rank times, span 0."""
    fold = RunFold(elastic_script(2))
    fold.apply_events([step(0, 0, 0.1)])
    fold.finish("completed")
    assert fold.closed_count == 0
    fold.apply_events([rank_started(0, world_size=1)])
    assert fold.steps_completed == 1
    fold.finish("completed")
    assert list(fold.closed) == [ClosedStep(0, pytest.approx(0.1), {}, {}, {}, 0.0, {})]


def test_an_event_of_no_rank_is_the_jobs_whatever_its_size_says() -> None:
    """The job's end names no rank: it is the job's even while the job is counted at no rank yet (an elastic
    job's size before its ranks say it): not refused."""
    fold = RunFold(elastic_script(0))
    fold.apply_events([JobEnded(wall_ns=5, status="completed", duration_s=1.0, root_cause_rank=None)])
    assert fold.rejected == {}
