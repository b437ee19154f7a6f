"""The folds under the run's figures, each against numbers worked out by hand: the GPUs' samples, the
collectives' rows and open steps, memory's change count, MFU's peaks, achieved FLOP/s and reasons for none,
the serving engine's series, the pipeline stages' actions and iterations, and what the run fold hands its
readers (the rows of the job, the ranks and nodes that need attention, what attention is kept by). The
comment beside an assertion says what it pins."""

from __future__ import annotations

import dataclasses

import pytest

from meshtop.probes.events import Event, EventsDropped, ProcessSample, ServerMetric
from meshtop.recordings.manifest import RunDescription
from meshtop.recordings.metrics.collectives import CollectiveFold, last_full_step
from meshtop.recordings.metrics.gpus import GpuFold, GpuRow
from meshtop.recordings.metrics.memory import MemoryFold
from meshtop.recordings.metrics.mfu import GpuModel, achieved_flops_per_rank, mfu, peak_flops, script_parameters
from meshtop.recordings.metrics.pipeline import StageFold, StageRow, step_bubbles
from meshtop.recordings.metrics.run import RunFold
from meshtop.recordings.metrics.server import ServerFigures, ServerFold
from meshtop.recordings.schema import table_of
from tests.kit.events import NO_LINKS, collective, fold_events, gpu_sample, memory_snapshot, stage_action, step
from tests.kit.recordings import description, elastic_script, with_model

GIB = 1 << 30


# -- GPUs --------------------------------------------------------------------------------------------------


def test_gpu_tables_folded_one_after_another_keep_the_peak_the_name_and_idle_samples() -> None:
    """GPU 0's first table: a sample named "NVIDIA H100" at 70 GiB, then one whose name read empty at 50 GiB,
    both idle (0 %); its second table: 60 GiB at 30 %, no name read. GPU 1 reads no utilisation in the first
    table, 50 % in the second. Peak 70 GiB (not the second table's 60); utilisation (0 + 0 + 30) / 3 = 10 %
    (an idle table adds 0, not 1); GPU 1 50 / 1 = 50 %; the empty name is no name: "NVIDIA H100" stays."""
    fold = GpuFold()
    fold.add(
        table_of(
            [
                gpu_sample(gpu=0, wall_ns=1, name="NVIDIA H100", memory_used_bytes=70 * GIB, utilization_pct=0.0),
                gpu_sample(gpu=0, wall_ns=2, name="", memory_used_bytes=50 * GIB, utilization_pct=0.0),
                gpu_sample(gpu=1, wall_ns=1, name="NVIDIA H100", memory_used_bytes=GIB),
            ]
        )
    )
    fold.add(
        table_of(
            [
                gpu_sample(gpu=0, wall_ns=3, name=None, memory_used_bytes=60 * GIB, utilization_pct=30.0),
                gpu_sample(gpu=1, wall_ns=3, name="NVIDIA H100", utilization_pct=50.0),
            ]
        )
    )
    assert fold.rows() == [
        GpuRow(node=0, gpu=0, name="NVIDIA H100", samples=3, peak_used_bytes=70 * GIB, total_bytes=None,
               utilization_mean_pct=10.0, links=NO_LINKS, links_over="run"),
        GpuRow(node=0, gpu=1, name="NVIDIA H100", samples=2, peak_used_bytes=GIB, total_bytes=None,
               utilization_mean_pct=50.0, links=NO_LINKS, links_over="run"),
    ]  # fmt: skip


# -- collectives -------------------------------------------------------------------------------------------


def test_a_collective_rows_json_names_its_busbw_p50_and_the_operations_it_is_taken_over() -> None:
    """Three all-reduces of 1 GB in a group of 4 (bus factor 2 x 3 / 4 = 1.5): 0.5 s alone (2 GB/s, busbw
    3.0), 0.25 s overlapped (left out of busbw), 1.0 s alone (1 GB/s, busbw 1.5). busbw p50 of [3.0, 1.5] =
    2.25 over 2 operations; in flight 1.75 s in all, p50 of [0.25, 0.5, 1.0] = 0.5, p99 at 0.99 x 2 = 1.98:
    0.5 + 0.98 x 0.5 = 0.99. No step closed: no exposed time."""
    fold = CollectiveFold(per_step=False)
    fold.add(
        table_of(
            [
                collective(0, 0, 0.5, group_size=4, bytes=10**9),
                collective(0, 1, 0.25, group_size=4, bytes=10**9, overlapped=True),
                collective(0, 2, 1.0, group_size=4, bytes=10**9),
            ]
        )
    )
    [row] = fold.rows()
    assert row.to_json() == {
        "group": "dp",
        "op": "all_reduce",
        "count": 3,
        "bytes": 3_000_000_000,
        "in_flight_s": {"total": pytest.approx(1.75), "p50": pytest.approx(0.5), "p99": pytest.approx(0.99)},
        "busbw_gbps": {"p50": pytest.approx(2.25), "ops": 2},
        "exposed_s": {"per_step": None, "share": None, "measured": None},
    }


def test_dropping_a_step_forgets_its_operations_and_a_step_with_none_is_no_error() -> None:
    fold = CollectiveFold(per_step=True)
    fold.add(table_of([collective(0, 0), collective(1, 0), collective(0, 1)]))
    assert fold.open_steps() == [0, 1]
    fold.drop(0)
    assert fold.open_steps() == [1]
    fold.drop(7)  # no operation of step 7 came: nothing to forget
    assert fold.open_steps() == [1]


def test_the_last_full_step_is_the_one_before_the_count_completed() -> None:
    assert last_full_step(0) is None  # none completed yet
    assert last_full_step(1) == 0  # one completed: step 0 (numbered from 0)
    assert last_full_step(5) == 4


# -- memory ------------------------------------------------------------------------------------------------


def test_a_memory_table_counts_each_replaced_last_snapshot_and_each_risen_peak_once() -> None:
    """Rank 0 at steps 0 and 1 (100, then 120 bytes, resident 1000), rank 1 at steps 0 and 1 (200, then 150,
    resident 2000). Changes: 2 last snapshots (each rank's step 1; its step 0 is not taken on the way) + 2
    allocator peaks (120, 200) + 2 resident peaks (1000, 2000) = 6. The same table again changes nothing."""
    snapshots = [
        memory_snapshot(0, 100, step=0, rss_bytes=1000),
        memory_snapshot(0, 120, step=1, rss_bytes=1000),
        memory_snapshot(1, 200, step=0, rss_bytes=2000),
        memory_snapshot(1, 150, step=1, rss_bytes=2000),
    ]
    fold = MemoryFold()
    fold.add(table_of(snapshots))
    assert fold.changes == 6
    assert fold.peaks() == {0: 120, 1: 200}
    assert {rank: last.weights_bytes for rank, last in fold.last.items()} == {0: 120, 1: 150}
    fold.add(table_of(snapshots))
    assert fold.changes == 6


# -- MFU ---------------------------------------------------------------------------------------------------


def test_a_gpu_named_by_a_string_and_a_card_at_its_power_limit_have_their_peaks() -> None:
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12  # a name alone: no limit, the SXM module
    assert peak_flops(GpuModel("NVIDIA H100", 450.0), "bf16") == 756e12  # at most 450 W: the PCIe card
    assert peak_flops(GpuModel("NVIDIA H100", 451.0), "bf16") == 989e12
    assert peak_flops(GpuModel("NVIDIA H200", 650.0), "bf16") == 835e12  # at most 650 W: the NVL card


def test_the_flops_a_rank_achieved_are_a_built_in_training_runs_only() -> None:
    """The tiny shape counted at 1B parameters (test_figures_by_hand's MFU case): 6,000,098,304 FLOPs a token;
    20,480 tokens/s over 4 ranks: 20,480 x 6,000,098,304 / 4 = 122,882,013,265,920 / 4 = 30,720,503,316,480."""
    run = with_model(description(dp=4), parameters=1_000_000_000)
    assert achieved_flops_per_rank(run, 20_480.0) == pytest.approx(30_720_503_316_480.0)
    assert achieved_flops_per_rank(run, None) is None  # no step yet
    assert achieved_flops_per_rank(dataclasses.replace(run, model=None), 20_480.0) is None  # no model shape
    # a served load's description leaves its lengths out; given one, still none: 6 N is forward and backward
    serving = dataclasses.replace(with_model(description(dp=4, mode="infer"), parameters=1_000_000_000), seq_len=64)
    assert serving.inference and serving.model is not None
    assert achieved_flops_per_rank(serving, 20_480.0) is None


# -- the serving engine ------------------------------------------------------------------------------------


def metric(wall_ns: int, name: str, value: float, common: str) -> ServerMetric:
    return ServerMetric(wall_ns=wall_ns, name=name, labels="", value=value, common=common)


def test_a_counter_unchanged_between_scrapes_adds_nothing_and_a_restart_counts_from_zero() -> None:
    """Prompt tokens 100 at the first scrape; the second leaves the counter out (unchanged: still 100); 130 at
    the third: +30; 20 at the fourth, a restart: +20. Increase 30 + 20 = 50."""
    fold = ServerFold()
    for event in [
        metric(1, "vllm:prompt_tokens_total", 100.0, "prompt_tokens"),
        metric(1, "vllm:num_requests_running", 2.0, "requests_running"),
        metric(2, "vllm:num_requests_running", 3.0, "requests_running"),
        metric(3, "vllm:prompt_tokens_total", 130.0, "prompt_tokens"),
        metric(4, "vllm:prompt_tokens_total", 20.0, "prompt_tokens"),
    ]:
        fold.add(event)
    figures = fold.figures()
    assert figures is not None
    assert figures.counters == {"prompt_tokens": 50.0}
    assert figures.gauges == {"requests_running": {"last": 3.0, "mean": 2.75, "max": 3.0}}  # (2 + 3 + 3 + 3) / 4


# -- inference stages --------------------------------------------------------------------------------------


def test_an_iteration_of_no_time_has_no_bubble_and_the_others_theirs_wait_over_duration() -> None:
    """Stage 0: an iteration of 0 s (no bubble: nothing to divide by), then 0.2 s waiting 0.05: 0.25. Busy
    (0 + 0.15) / 2 = 0.075, idle 0.05 / 2 = 0.025, fraction 0.05 / 0.2 = 0.25."""
    fold = StageFold(pp=2)
    fold.add_iteration(0, 0.0, 0.0, shown=True)
    fold.add_iteration(0, 0.2, 0.05, shown=True)
    assert fold.stages[0].bubble.values().tolist() == [pytest.approx(0.25)]
    assert list(fold.stages[0].recent) == [pytest.approx(0.25)]
    assert fold.rows() == [
        StageRow(stage=0, busy_s=pytest.approx(0.075), idle_s=pytest.approx(0.025), bubble_fraction=0.25)
    ]


# -- the run fold ------------------------------------------------------------------------------------------


def test_the_rows_of_the_job_leave_out_other_ranks_and_negative_steps_without_counting_them() -> None:
    """A job of 2 ranks: rank 1's step of -0.5 s and rank 7's are not the job's; a table that is all the job's
        comes back as it is (the screen asks every frame: no copy); a one-row table of another rank's, empty. Drops
    reported by the collector (rank none) and by rank 1 are the job's, rank 7's are not."""
    fold = RunFold(description(dp=2))
    mixed = table_of([step(0, 0), step(1, 0, -0.5), step(7, 0)])
    assert fold.of_the_job("step", mixed).column("rank").to_pylist() == [0]
    whole = table_of([step(0, 0), step(1, 0)])
    assert fold.of_the_job("step", whole) is whole
    assert len(fold.of_the_job("step", table_of([step(7, 0)]))) == 0
    operations = table_of([collective(0, 0), collective(1, 0)])
    assert fold.of_the_job("collective", operations) is operations
    of_no_group = table_of([collective(0, 0), collective(1, 0, group_size=0)])
    assert fold.of_the_job("collective", of_no_group).column("rank").to_pylist() == [0]
    dropped = [EventsDropped(wall_ns=0, rank=rank, where="w", count=1) for rank in (None, 1, 7)]
    assert fold.of_the_job("events_dropped", table_of(dropped)).column("rank").to_pylist() == [
        None,
        1,
    ]  # None: the collector's
    assert fold.rejected == {}  # for a reader beside the fold: not counted again


def test_an_inference_runs_steps_are_rank_0s_iterations_and_each_stage_has_its_waits() -> None:
    """pp 2 serving. A table of rank 1's iterations alone (stage 1: 10 ms waiting 5, 30 ms waiting 3) completes
    no step (a served run's steps are rank 0's iterations) and gives stage 1 its bubble: (5 + 3) / 40 = 0.2.
    Then rank 0's (stage 0: 10 ms waiting 4): one step, stage 0's bubble 4 / 10 = 0.4."""
    fold = RunFold(description(pp=2, mode="infer"))
    fold.apply("step", table_of([step(1, 0, 0.010, pipeline_wait_s=0.005), step(1, 1, 0.030, pipeline_wait_s=0.003)]))
    assert fold.steps_completed == 0
    assert [(row.stage, row.bubble_fraction) for row in fold.figures().stages] == [(1, pytest.approx(0.2))]
    fold.apply("step", table_of([step(0, 0, 0.010, pipeline_wait_s=0.004)]))
    assert fold.steps_completed == 1
    stages = fold.figures().stages
    assert [(row.stage, row.bubble_fraction) for row in stages] == [(0, pytest.approx(0.4)), (1, pytest.approx(0.2))]


def test_a_gpus_model_is_taken_from_its_first_sample_that_names_it() -> None:
    """GPU 0's first sample read no name, its second "NVIDIA H100 80GB HBM3" at 700 W: an H100 SXM, 989e12 a
    GPU in bf16 (no step yet, so no MFU)."""
    fold = RunFold(description(dp=1, device="cuda", dtype="bf16"))
    fold.apply(
        "gpu",
        table_of(
            [
                gpu_sample(gpu=0, wall_ns=1, name=None, power_limit_w=None),
                gpu_sample(gpu=0, wall_ns=2, name="NVIDIA H100 80GB HBM3", power_limit_w=700.0),
            ]
        ),
    )
    assert fold.gpu_models == {(0, 0): GpuModel("NVIDIA H100 80GB HBM3", 700.0)}
    found = fold.figures().mfu
    assert (found.value, found.why_not, found.peak_flops_per_s) == (None, "no complete step yet", 989e12)


def memory_job() -> RunFold:
    """4 ranks on 80 GiB GPUs with allocator peaks of 40, 40, 40 and 70 GiB: headroom 40, 40, 40 and 10 GiB;
    and 3 steps, closed at the end."""
    fold = RunFold(description(dp=4, device="cuda"))
    events: list[Event] = [
        memory_snapshot(rank, peak * GIB, device_total_bytes=80 * GIB) for rank, peak in enumerate((40, 40, 40, 70))
    ]
    events += [step(rank, number) for number in range(3) for rank in range(4)]
    fold_events(fold, events)
    fold.finish("completed")
    return fold


def test_the_rank_short_of_headroom_stands_out_and_its_node_by_the_nodes_given() -> None:
    """Headroom 40, 40, 40, 10 GiB: median 40, MAD 0, rank 3 30 GiB under it (past 5 % of 40 GiB and 64 MiB):
    z infinite, flagged. Given one node a rank, node 3 stands out too; by default each rank is where its start
    said, and none said: one node, not scored."""
    fold = memory_job()
    found = fold.attention("headroom", node_of={0: 0, 1: 1, 2: 2, 3: 3})
    assert found.median == 40 * GIB
    assert found.flagged_ranks == (3,)
    assert found.flagged_nodes == (3,)
    assert fold.attention("headroom").nodes == ()


def test_attention_is_kept_by_the_steps_closed_or_by_the_memory_changes() -> None:
    """3 steps closed; memory: 4 ranks' first snapshots (4) and allocator peaks (4), no resident set: 8."""
    fold = memory_job()
    assert fold.closed_count == 3
    assert [fold.attention_input(measure) for measure in ("step", "communication", "headroom")] == [3, 3, 8]


# -- survivors of the run of 2026-12-05 17:00 ----------------------------------------------------------------


def test_memory_of_nothing_peaks_at_nothing_and_each_process_tables_rises_are_counted() -> None:
    """Rank 0's snapshot holding 0 bytes (its peak 0, not 1), resident 500: 1 last snapshot + 1 allocator
    peak + 1 resident peak = 3 changes. A process table of rank 0 at 800 (risen) and rank 1 at 300 (a first
    reading): 5; the same table again raises nothing: still 5."""
    fold = MemoryFold()
    fold.add(table_of([memory_snapshot(0, 0, rss_bytes=500)]))
    assert fold.changes == 3
    assert fold.peaks() == {0: 0}
    processes = table_of(
        [
            ProcessSample(rank=0, pid=10, wall_ns=2, cpu_pct=None, rss_bytes=800, threads=None),
            ProcessSample(rank=1, pid=11, wall_ns=2, cpu_pct=None, rss_bytes=300, threads=None),
        ]
    )
    fold.add_process(processes)
    assert fold.changes == 5
    fold.add_process(processes)
    assert fold.changes == 5
    assert fold.peaks() == {0: 0, 1: 300}  # rank 0's is its allocator's; rank 1 has only a resident set


def test_a_scripts_parameters_are_the_most_a_pipeline_rank_trains_summed_and_none_before_any() -> None:
    """Pipeline rank 0: 100 then 50 (a replica reporting less later): 100; rank 1: 0 (it trains nothing): 0."""
    assert script_parameters([]) is None
    assert script_parameters([(0, 100), (1, 0), (0, 50)]) == 100 + 0
    assert script_parameters([(1, 0)]) == 0


def test_a_run_without_mfu_says_why() -> None:
    training = with_model(description(dp=4, device="cuda", dtype="bf16"), parameters=1_000_000_000)
    h100 = [GpuModel("NVIDIA H100 80GB HBM3", 700.0)]

    def why_not(run: RunDescription, gpus: list[GpuModel] = h100, parameters: int | None = None) -> str | None:
        found = mfu(run, gpus=gpus, tokens_per_s=20_480.0, script_parameters=parameters)
        assert found.value is None
        return found.why_not

    assert why_not(description(dp=1, mode="infer")) == (
        "MFU is a training figure (6N FLOPs per token is forward and backward)"
    )
    assert why_not(description(dp=1)) == "no peak FLOP/s for a cpu device"
    script = dataclasses.replace(elastic_script(2), device="cuda")
    needs = "a script's MFU needs --tokens-per-step and --dtype (its compute dtype)"
    assert why_not(script) == needs  # neither
    with_tokens = dataclasses.replace(script, script=dataclasses.replace(script.script, tokens_per_step=4096))
    assert why_not(with_tokens, parameters=10**6) == needs  # tokens but no dtype
    assert why_not(dataclasses.replace(with_tokens, dtype="bf16")) == (
        "the script's parameter count comes with its first optimizer step"
    )
    no_shape = "the run description has no model shape or sequence length"
    assert why_not(dataclasses.replace(training, dtype=None)) == no_shape  # a model and a length, no dtype
    assert why_not(dataclasses.replace(training, model=None)) == no_shape  # a dtype and a length, no model
    found = mfu(training, gpus=[], tokens_per_s=20_480.0)
    assert (found.value, found.why_not, found.flops_per_token) == (None, "no GPU seen yet", 6_000_098_304.0)


def test_gpus_of_one_name_with_and_without_a_power_limit_have_their_mfu() -> None:
    """An H100 whose limit was not read and one at 700 W: both SXM modules, 989e12 each. 20,480 tokens/s x
    6,000,098,304 FLOPs a token = 122,882,013,265,920 FLOP/s over 4 x 989e12 = 3.956e15: 0.0310621873776."""
    run = with_model(description(dp=4, device="cuda", dtype="bf16"), parameters=1_000_000_000)
    found = mfu(run, gpus=[GpuModel("NVIDIA H100", None), GpuModel("NVIDIA H100", 700.0)], tokens_per_s=20_480.0)
    assert (found.why_not, found.peak_flops_per_s, found.gpus) == (None, 989e12, 4)
    assert found.value == pytest.approx(0.0310621873776)


def test_a_step_or_a_stage_of_no_time_has_no_bubble() -> None:
    """No stage busy and no forward-backward time: a span of 0 and no bubbles; a forward-backward of 0.5 s with
    no stage busy: span 0.5, still none; a stage busy for 0 s: span 0, none (nothing to divide by). Inference:
    stage 0's one iteration took no time (fraction 0, not 0 / 0), stage 1's 0.1 s all waiting (busy 0), stage
    2's 0.1 s without a wait (idle 0)."""
    assert step_bubbles({}, None) == (0.0, {})
    assert step_bubbles({}, 0.5) == (0.5, {})
    assert step_bubbles({0: 0.0}, None) == (0.0, {})
    fold = StageFold(pp=3)
    fold.add_iteration(0, 0.0, 0.0, shown=False)
    fold.add_iteration(1, 0.1, 0.1, shown=False)
    fold.add_iteration(2, 0.1, 0.0, shown=False)
    assert fold.rows() == [
        StageRow(stage=0, busy_s=0.0, idle_s=0.0, bubble_fraction=0.0),
        StageRow(stage=1, busy_s=0.0, idle_s=0.1, bubble_fraction=1.0),
        StageRow(stage=2, busy_s=0.1, idle_s=0.0, bubble_fraction=0.0),
    ]


def test_stage_actions_go_to_their_pipeline_rank_and_a_closed_step_takes_no_more() -> None:
    """pp 2; each action 1 ms. Actions outside any step are no step's. Step 0: rank 0 runs stage 0, rank 1
    stages 3 and 1 (interleaved: 3 mod 2 = pipeline rank 1): stage 0 busy 1 ms, stage 1 2 ms to the
    nanosecond. Closed with a forward-backward of 4 ms: bubbles (4 - 1) / 4 = 0.75 and (4 - 2) / 4 = 0.5.
    A late action of step 0 is not taken; step 1's, after it in the same table, is. With no pp, a stage is
    its own pipeline rank."""
    fold = StageFold(pp=2)
    fold.add_actions(table_of([stage_action(0, None), stage_action(1, None)]))
    assert fold.open_steps() == []
    fold.add_actions(
        table_of([stage_action(0, 0, stage=0), stage_action(1, 0, stage=3), stage_action(1, 0, "backward", stage=1)])
    )
    assert fold.busy_by_stage(0) == {0: 0.001, 1: 0.002}
    assert fold.close(0, 0.004) == (0.004, {0: pytest.approx(0.75), 1: pytest.approx(0.5)})
    assert fold.open_steps() == []
    assert list(fold.stages[0].recent) == [pytest.approx(0.75)]
    fold.add_actions(table_of([stage_action(0, 0, "backward"), stage_action(0, 1)]))
    assert fold.open_steps() == [1]
    alone = StageFold(pp=None)
    alone.add_actions(table_of([stage_action(0, 0, stage=3)]))
    assert alone.busy_by_stage(0) == {3: 0.001}


def labelled(wall_ns: int, name: str, labels: str, value: float, common: str) -> ServerMetric:
    return ServerMetric(wall_ns=wall_ns, name=name, labels=labels, value=value, common=common)


def test_the_engines_queues_are_summed_its_caches_the_fullest_and_each_scrape_is_on_the_timeline() -> None:
    """Two engines (labels a, b). Scrape 1: running 2 + 1 = 3, cache max(0.5, 0.25) = 0.5, prompt tokens 100.
    Scrape 2: running a 1 (b unchanged 1): 2, cache b 0.75: 0.75. Scrape 3 (still open): generation tokens 7,
    a first reading. Running: last 2, mean (3 + 2 + 2) / 3 = 7 / 3, max 3; cache: last 0.75, mean (0.5 +
    0.75 + 0.75) / 3 = 2 / 3, max 0.75. Prompt tokens never rose, generation tokens read once: 0 each.
    Series: running a, b, cache a, b, prompt, generation: 6."""
    fold = ServerFold()
    assert fold.figures() is None
    assert fold.timeline() == []
    for event in [
        labelled(1, "vllm:num_requests_running", "a", 2.0, "requests_running"),
        labelled(1, "vllm:num_requests_running", "b", 1.0, "requests_running"),
        labelled(1, "vllm:gpu_cache_usage_perc", "a", 0.5, "kv_cache_usage"),
        labelled(1, "vllm:gpu_cache_usage_perc", "b", 0.25, "kv_cache_usage"),
        labelled(1, "vllm:prompt_tokens_total", "", 100.0, "prompt_tokens"),
        labelled(2, "vllm:num_requests_running", "a", 1.0, "requests_running"),
        labelled(2, "vllm:gpu_cache_usage_perc", "b", 0.75, "kv_cache_usage"),
        labelled(3, "vllm:generation_tokens_total", "", 7.0, "generation_tokens"),
    ]:
        fold.add(event)
    assert fold.figures() == ServerFigures(
        scrapes=3,
        series=6,
        gauges={
            "requests_running": {"last": 2.0, "mean": pytest.approx(7 / 3), "max": 3.0},
            "kv_cache_usage": {"last": 0.75, "mean": pytest.approx(2 / 3), "max": 0.75},
        },
        counters={"prompt_tokens": 0.0, "generation_tokens": 0.0},
        thirds={"requests_running": (3.0, 2.0), "kv_cache_usage": (0.5, 0.75)},
    )  # thirds of 3 scrapes: the first scrape's value and the last's
    assert list(fold.recent["requests_running"]) == [3.0, 2.0]  # the scrapes closed: 1 and 2
    assert list(fold.recent["kv_cache_usage"]) == [0.5, 0.75]
    assert fold.timeline() == [
        (1, "requests_running", 3.0), (1, "kv_cache_usage", 0.5), (1, "prompt_tokens", 100.0),
        (2, "requests_running", 2.0), (2, "kv_cache_usage", 0.75), (2, "prompt_tokens", 100.0),
        (3, "requests_running", 2.0), (3, "kv_cache_usage", 0.75), (3, "prompt_tokens", 100.0),
        (3, "generation_tokens", 7.0),
    ]  # fmt: skip


def test_a_gauges_thirds_are_of_the_scrapes_while_the_load_was_sent() -> None:
    """Waiting 0, 2, 4, 6, 8, 10, 12 at scrapes 1 .. 7, then 3 as the backlog drains (scrape 8, open). Sent
    from 2 to 7: 2, 4, 6, 8, 10, 12, thirds of 2: (2 + 4) / 2 = 3 and (10 + 12) / 2 = 11. All 8 scrapes:
    thirds of 2: (0 + 2) / 2 = 1 and (12 + 3) / 2 = 7.5. Sent from 2 to 3: 2 scrapes, too few for thirds."""
    fold = ServerFold()
    for scrape, waiting in enumerate((0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 3.0), start=1):
        fold.add(labelled(scrape, "vllm:num_requests_waiting", "", waiting, "requests_waiting"))
    sent = fold.figures((2, 7))
    assert sent is not None and sent.thirds == {"requests_waiting": (3.0, 11.0)}
    every = fold.figures()
    assert every is not None and every.thirds == {"requests_waiting": (1.0, 7.5)}
    short = fold.figures((2, 3))
    assert short is not None and short.thirds == {}


def test_the_dashboard_keeps_a_gauges_last_240_scrapes() -> None:
    """Scrapes 0 .. 241 of one gauge, valued as their number: 241 closed (the last is open), the latest 240
    kept: 1 .. 240."""
    fold = ServerFold()
    for wall_ns in range(242):
        fold.add(metric(wall_ns, "vllm:num_requests_running", float(wall_ns), "requests_running"))
    recent = list(fold.recent["requests_running"])
    assert (len(recent), recent[0], recent[-1]) == (240, 1.0, 240.0)
