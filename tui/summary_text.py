"""The summary of a recording as readable text."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Any

from meshtop.recordings.metrics.attention import LABELS, Z_LIMIT
from meshtop.recordings.metrics.requests import LATENCIES, Slo
from meshtop.recordings.notices import ranks_text
from meshtop.runner.plan import recipe_words
from meshtop.tui.charts import human_rate


def human_bytes(count: float | None) -> str:
    if count is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def human_seconds(value: float | None) -> str:
    """A duration as the dashboard and the summary's collectives table print it (``40.3 ms``)."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if value >= 60:
        minutes, seconds = divmod(int(value), 60)
        return f"{minutes}:{seconds:02d}"
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} µs"


def busbw_text(gbps: float | None) -> str:
    """Bus bandwidth as the dashboard and the summary print it: three significant digits in the unit that keeps
    them before the point (``4.56 MB/s``, ``12.3 GB/s``)."""
    if gbps is None:
        return "-"
    for unit, scale in (("TB/s", 1e3), ("GB/s", 1.0), ("MB/s", 1e-3), ("kB/s", 1e-6)):
        if gbps >= scale:
            return f"{gbps / scale:.3g} {unit}"
    return f"{gbps / 1e-9:.3g} B/s"


def aligned(cells: Iterable[str], widths: Iterable[int], between: str = "") -> str:
    """A row of a text table: each cell padded to its width (a negative width aligns it left), ``between``
    between two."""
    pairs = zip(cells, widths, strict=True)
    return between.join(f"{cell:<{-width}}" if width < 0 else f"{cell:>{width}}" for cell, width in pairs)


def or_dash(value: float | None, spec: str, *, scale: float = 1.0, unit: str = "") -> str:
    """``value`` times ``scale`` formatted by ``spec`` (``.0%``), then ``unit``; ``-`` where there is none."""
    return "-" if value is None else f"{format(value * scale, spec)}{unit}"


def exposed_share(value: float | None, measured: bool | None) -> str:
    """An exposed share of the step as the dashboard and the summary print it: ``≤`` where some step's figure is
    the in-flight bound."""
    return "-" if value is None else f"{'' if measured else '≤'}{value:.0%}"


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.3f} s"


def milliseconds(value: float | None) -> str:
    return or_dash(value, ",.2f", scale=1e3)


def per_second(value: float | None, unit: str) -> str:
    return f"- {unit}" if value is None else f"{value:,.2f} {unit}"


MEMORY_RANKS = 16
"""Past this many ranks, the memory lines name the most loaded ones and sum up the rest (``--json`` has each)."""
MEMORY_TOP = 8
COLLECTIVE_TITLES = ("group", "op", "count", "bytes", "in flight", "p50", "p99", "busbw p50", "exposed/step", "% step")
COLLECTIVE_WIDTHS = (-6, -16, 7, 12, 12, 11, 11, 13, 14, 8)
"""The summary's collectives table: each column's width (a negative width aligns left)."""

TOKEN_SOURCES = {"usage": "the server's usage", "chunks": "streamed chunks (no usage reported)"}


def request_lines(requests: dict[str, Any], *, endpoint: bool = False) -> list[str]:
    """An inference run's requests: counts and failures, latency quantiles in ms, rates, each replica."""
    warmup = f"  (after {requests['warmup']} warmup, left out)" if requests.get("warmup") else ""
    not_sent = f"  not sent {requests['not_sent']}" if requests.get("not_sent") else ""
    lines = [
        f"requests: {requests['count']}  completed {requests['completed']}  failed {requests['failed']}{not_sent}"
        f"{warmup}"
    ]
    lines += [f"  failed {row['count']}: {row['reason']}" for row in requests["failures"]]
    lines.append(f"  {'latency (ms)':<14}{'p50':>10}{'p90':>10}{'p99':>10}")
    for key, label in LATENCIES.items():
        lines.append(f"  {label:<14}" + "".join(f"{milliseconds(requests[key][q]):>10}" for q in ("p50", "p90", "p99")))
    rates = (
        f"  {per_second(requests['request_throughput_per_s'], 'req/s')}"
        f"  {per_second(requests['output_tokens_per_s'], 'output tok/s')}"
    )
    if requests["slo"] is not None:
        slo = Slo(**requests["slo"])
        rates += (
            f"  goodput {per_second(requests['goodput_per_s'], 'req/s')}"
            f" ({requests['slo_met']:.1%} of requests met {slo.describe()})"
        )
    lines.append(rates)
    if tokens_from := requests.get("tokens_from"):
        lines.append(
            "  tokens counted by "
            + ", ".join(f"{TOKEN_SOURCES.get(source, source)} ({count})" for source, count in tokens_from.items())
        )
    if (client := requests.get("client")) is not None:
        lag = client["send_lag_s"]
        asked = client["asked_rate_per_s"]
        rate = (
            f"  sent {per_second(client['achieved_rate_per_s'], 'req/s')} of {asked:,.2f} asked"
            if asked is not None
            else ""
        )
        cpu = client.get("cpu_pct", {}).get("mean")
        used = f"  CPU {cpu:.0f} % of a core" if cpu is not None else ""
        lines.append(
            f"  client: send lag p50 {milliseconds(lag['p50'])} ms  p99 {milliseconds(lag['p99'])} ms{rate}{used}"
        )
        if client["limited"]:
            lines.append(f"  {client['limited']}")
    if endpoint and len(requests["per_replica"]) < 2:  # one server: no replicas
        return lines
    for row in requests["per_replica"]:
        lines.append(
            f"  replica {row['replica']}: {row['completed']} completed"
            f"  {per_second(row['output_tokens_per_s'], 'output tok/s')}"
            f"  TTFT p50 {milliseconds(row['ttft_s']['p50'])} ms"
        )
    return lines


def steps_line(steps: dict[str, Any], inference: bool, script: bool = False) -> str:
    """Training: the job's steps and tokens/s; inference: rank 0's engine iterations (tokens/s is per request)."""
    if script and not steps["count"]:
        return "steps: none (the script stepped no torch.optim optimizer)"
    times = (
        f"p50 {seconds(steps['time_s']['p50'])}  p90 {seconds(steps['time_s']['p90'])}"
        f"  mean {seconds(steps['time_s']['mean'])}"
    )
    if inference:
        return f"iterations (rank 0): {steps['count']}  {times}"
    return f"steps: {steps['count']}  {times}" + (
        f"  {steps['tokens_per_s']['p50']:,.0f} tok/s" if steps["tokens_per_s"]["p50"] else ""
    )


def loss_line(loss: dict[str, Any]) -> str | None:
    """``loss: 2.31 first, 1.95 last`` and, for a script's, what it is made of; from which step it was not a
    number, where it diverged; ``None`` with no loss."""
    not_finite_from = loss.get("not_finite_from")
    if loss["first"] is None and not_finite_from is None:
        return None
    said = []
    if loss["first"] is None:  # not a number from the first step on
        assert not_finite_from is not None, "no first loss, so one that was not finite"
        line = f"loss: NaN or infinite from step {not_finite_from + 1}"
    else:
        last = "not finite" if loss["last"] is None else f"{loss['last']:.4g}"
        line = f"loss: {loss['first']:.4g} first, {last} last"
        if not_finite_from is not None:
            said.append(f"NaN or infinite from step {not_finite_from + 1}")
    if loss.get("ranks") is not None and loss["ranks"] < loss["of_ranks"]:
        said.append(f"from {loss['ranks']} of {loss['of_ranks']} ranks: the others compute none")
    if loss.get("per_step") is not None and loss["per_step"] > 1:
        said.append(f"each rank's from its {loss['per_step']} losses a step")
    return line + (f" ({'; '.join(said)})" if said else "")


def breakdown_line(
    parts: dict[str, dict[str, float]] | None, label: str = "where the step goes (all ranks)"
) -> str | None:
    """``where the step goes (all ranks): communication 53 %, forward 15 %, ...`` from the breakdown's
    ``parts`` (those of 1 % or more, the largest first); ``None`` where no rank measured its phases."""
    if not parts:
        return None
    shares = sorted(((row["share"], part) for part, row in parts.items()), reverse=True)
    said = [f"{part} {share:.0%}" for share, part in shares if share >= 0.01]
    return f"{label}: " + ", ".join(said).replace("%", " %")


def run_words(run: dict[str, Any]) -> str:
    """``dp2 x tp1 x pp1 · model tiny · cpu fp32`` (``· cpu mixed (bf16 compute) · checkpoint full`` for a
    recipe), ``torchrun train.py (2 ranks) · cpu`` for a script, or
    ``endpoint http://host:8000 (completions) · model NAME`` for a served load."""
    if run.get("endpoint") is not None:
        return f"{run['label']} · model {run['endpoint']['model'] or '- (the server never said)'}"
    if run["script"] is not None:
        return f"{run['label']} · {run['device']}"
    plan = f"dp{run['dp']}{' (fsdp)' if run['fsdp'] else ''} x tp{run['tp']} x pp{run['pp']}"
    if run["schedule"]:
        plan += f" ({run['schedule']}, {run['microbatches']} mb)"
    if run["mode"] == "infer":
        plan += " · inference"
    recipe = recipe_words(run["dtype"], run.get("precision"), run.get("checkpoint"))
    return f"{plan} · model {run['model']} · {run['device']} {recipe}"


def blocker_lines(blocker: dict[str, str] | None) -> list[str]:
    """``blocker: bubble``, its evidence and its suggestion, a line each; none where the rule judged nothing."""
    if blocker is None:
        return []
    return [f"blocker: {blocker['kind']}", f"  {blocker['evidence']}", f"  try: {blocker['suggestion']}"]


def straggler_lines(stragglers: list[dict[str, Any]]) -> list[str]:
    """Each straggler as the dashboard's alert names it, with its compute time against its peers'."""
    return [
        f"{row['verdict']} (stage {row['stage']}: {seconds(row['compute_s'])} against "
        f"{seconds(row['peers_compute_s'])} of compute a step, over its last steps)"
        for row in stragglers
    ]


def summary_lines(summary: dict[str, Any]) -> list[str]:
    run, steps, requests = summary["run"], summary["steps"], summary.get("requests")
    if run.get("endpoint") is not None:
        lines = [f"recording {summary['recording']}: {run['status']}", f"  {run_words(run)}"]
        if run.get("reason"):
            lines.append(f"  {run['reason']}")
        lines += started_server_lines(run["endpoint"].get("server"))
        return (
            lines
            + request_lines(requests or {}, endpoint=True)
            + server_lines(summary.get("server"))
            + blocker_lines(summary.get("blocker"))
            + gpu_lines(summary)
        )
    lines = [
        f"recording {summary['recording']}: {run['status']}",
        f"  {run_words(run)} · {run['world_size']} ranks" + ("" if run["instrumented"] else " · not instrumented"),
        steps_line(steps, requests is not None, script=run["script"] is not None),
    ]
    if (loss := loss_line(steps["loss"])) is not None:
        lines.append(loss)
    if (breakdown := breakdown_line((summary.get("breakdown") or {}).get("parts"))) is not None:
        lines.append(breakdown)
    lines += blocker_lines(summary.get("blocker"))
    if run.get("hang"):  # meshtop's report of the hang that stopped it, torch's flight recorder's beside it
        first, *rest = run["hang"].splitlines()
        lines += [f"hung: {first}", *(f"  {line}" for line in rest)]
    if requests is not None:
        lines += request_lines(requests) + gpu_lines(summary)
    mfu = summary["mfu"]
    if mfu["value"] is not None:
        lines.append(
            f"MFU {mfu['value']:.1%} ({mfu['tokens_per_s']:,.0f} tok/s x {mfu['flops_per_token']:.3g} FLOP/token "
            f"over {mfu['gpus']} x {mfu['peak_flops_per_s'] / 1e12:,.0f} TFLOP/s)"
        )
    if summary["collectives"]:
        lines.append(
            "collectives (all ranks, in steps; in flight: issue to completion; exposed: what the ranks "
            "waited, ≤ a bound where no wait was seen):"
        )
        lines.append("  " + aligned(COLLECTIVE_TITLES, COLLECTIVE_WIDTHS))
        for row in summary["collectives"]:
            busbw, flight, exposed = row["busbw_gbps"]["p50"], row["in_flight_s"], row["exposed_s"]
            bound = "" if exposed["measured"] or exposed["measured"] is None else "≤"
            per_step = f"{bound}{seconds(exposed['per_step'])}" if exposed["per_step"] is not None else "-"
            cells = [row["group"], row["op"], str(row["count"]), human_bytes(row["bytes"]), seconds(flight["total"])]
            cells += [human_seconds(flight["p50"]), human_seconds(flight["p99"]), busbw_text(busbw), per_step]
            cells.append(exposed_share(exposed["share"], exposed["measured"]))
            lines.append("  " + aligned(cells, COLLECTIVE_WIDTHS))
    if summary["stages"]:
        lines.append(f"pipeline stages (mean per {'iteration' if requests is not None else 'step'}):")
        for row in summary["stages"]:
            lines.append(
                f"  stage {row['stage']}: busy {seconds(row['busy_s'])}  idle {seconds(row['idle_s'])}"
                f"  bubble {row['bubble_fraction']:.1%}"
            )
    lines += straggler_lines(summary["stragglers"])
    starts = summary.get("starts") or []
    if len(starts) > 1:
        lines.append(
            f"torchrun started the ranks {len(starts)} times: "
            + ", ".join(f"{start['world_size']} ranks from step {start['first_step']}" for start in starts)
        )
    hosts = summary.get("hosts") or []
    if len(hosts) > 1:
        lines.append("hosts (clock: the head's minus the node's, within half the round trip):")
        for host in hosts:
            offset, rtt = host["clock_offset_ns"], host["clock_rtt_ns"]
            clock = f"{offset / 1e6:+.3f} ms ± {rtt / 2e6:.3f} ms" if offset is not None and rtt is not None else "-"
            lines.append(
                f"  node {host['node']} {host['host'] or '?'}: ranks {ranks_text(host['ranks'])}  "
                f"GPUs {len(host['gpus'])}  clock {clock}  peak {human_bytes(host['peak_bytes'])}"
            )
    node_of = {rank["rank"]: rank["node"] for rank in summary["ranks"]} if len(hosts) > 1 else {}
    if summary["memory"]:
        lines += memory_lines(summary, node_of)
    failed = [r for r in summary["ranks"] if r["exit_code"] not in (0, None)]
    for rank in failed:
        how = f"signal {rank['signal']}" if rank["signal"] else f"exit code {rank['exit_code']}"
        where = f" (node {rank['node']}, {rank['host']})" if len(hosts) > 1 and rank.get("node") is not None else ""
        lines.append(f"rank {rank['rank']}{where}: {how}: {rank['error'] or ''}".rstrip(": "))
    return lines


def memory_lines(summary: dict[str, Any], node_of: dict[int, int]) -> list[str]:
    """Each rank's memory; past :data:`MEMORY_RANKS` ranks, the :data:`MEMORY_TOP` with the highest peak, and
    one line for the others."""
    rows = summary["memory"]
    shown = rows
    if len(rows) > MEMORY_RANKS:
        shown = sorted(rows, key=lambda row: (-(row["peak_bytes"] or 0), row["rank"]))[:MEMORY_TOP]
    heading = "memory (last step; peak over the run)"
    lines = [f"{heading}:" if shown is rows else f"{heading}, the {len(shown)} ranks of highest peak:"]
    for row in shown:
        marker = "  <- most loaded" if row["rank"] == summary["most_loaded_rank"] else ""
        where = f" (node {node_of[row['rank']]})" if node_of.get(row["rank"]) is not None else ""
        lines.append(
            f"  rank {row['rank']}{where}: peak {human_bytes(row['peak_bytes'])}  weights "
            f"{human_bytes(row['weights_bytes'])}  grads {human_bytes(row['grads_bytes'])}  optimizer "
            f"{human_bytes(row['optimizer_bytes'])}  activations {human_bytes(row['activations_bytes'])}"
            + ("" if row["kv_cache_bytes"] is None else f"  kv cache {human_bytes(row['kv_cache_bytes'])}")
            + marker
        )
    if shown is not rows:
        named = {row["rank"] for row in shown}
        rest = sorted(row["peak_bytes"] for row in rows if row["rank"] not in named and row["peak_bytes"] is not None)
        if rest:
            lines.append(
                f"  the other {len(rows) - len(shown)} ranks: peak {human_bytes(rest[0])} to "
                f"{human_bytes(rest[-1])}, median {human_bytes(rest[len(rest) // 2])} (--json lists every rank)"
            )
    return lines


SERVER_GAUGES = {
    "requests_running": ("running", 1.0, ""),
    "requests_waiting": ("waiting", 1.0, ""),
    "kv_cache_usage": ("KV cache", 100.0, " %"),
}
"""The engine's gauges meshtop reads, as the summary and the requests panel write them: name -> (label, scale,
unit)."""


def server_lines(server: dict[str, Any] | None) -> list[str]:
    """The engine's own view from its ``/metrics``: its queue and KV cache over the run, what it counted."""
    if server is None:
        return []
    parts = [
        f"{label} mean {server[name]['mean'] * scale:,.1f}{unit} max {server[name]['max'] * scale:,.0f}{unit}"
        for name, (label, scale, unit) in SERVER_GAUGES.items()
        if name in server
    ]
    parts += [
        f"{name.replace('_', ' ')} +{server[name]:,.0f}"
        for name in ("preemptions", "prompt_tokens", "generation_tokens")
        if name in server
    ]
    what = "  ".join(parts) if parts else "no series of an engine meshtop knows"
    return [f"server (its /metrics, {server['scrapes']} scrapes, {server['series']} series): {what}"]


def started_server_lines(server: dict[str, Any] | None) -> list[str]:
    """A server meshtop started: its command, how long it took to answer, how it ended, what it used."""
    if server is None:
        return []
    parts = [f"started by meshtop: {shlex.join(server['command'])}"]
    if server.get("version"):
        parts.append(f"version {server['version']}")
    if server.get("startup_s") is not None:
        parts.append(f"answered after {server['startup_s']:.1f} s")
    if server.get("exit_code") is not None:
        parts.append(f"exit code {server['exit_code']}")
    if server.get("cpu_s") is not None:
        parts.append(f"CPU {server['cpu_s']:.1f} s")
    if server.get("peak_rss_bytes") is not None:
        parts.append(f"peak memory {human_bytes(server['peak_rss_bytes'])}")
    return ["  server: " + ", ".join(parts)]


def gpu_lines(summary: dict[str, Any]) -> list[str]:
    """Each GPU sampled (the whole device, whoever used it): its peak memory and mean utilisation; then its
    links' mean and peak rates, where NVML read them (a link it read none of is left out: unknown)."""
    lines = []
    for row in summary.get("gpus") or []:
        where = f"node {row['node']} " if row["node"] else ""
        busy = or_dash(row["utilization_mean_pct"], ".0f", unit=" %")
        lines.append(
            f"{where}GPU {row['gpu']} ({row['name'] or '?'}): peak {human_bytes(row['peak_used_bytes'])} used of "
            f"{human_bytes(row['total_bytes'])}, utilisation mean {busy}"
        )
        if (rates := link_rates_text(row["links"], row["links_over"])) is not None:
            lines.append(f"  {rates}")
    return lines


def link_rates_text(links: dict[str, dict[str, float | None]], over: str) -> str | None:
    """A GPU's link rates (the metrics core's ``GpuRow.links``) in words: each link's tx and rx, mean / peak over
    ``over`` (the load or the run); a link NVML read none of is left out, and ``None`` where it read neither."""
    words = []
    for link, label in (("pcie", "PCIe"), ("nvlink", "NVLink")):
        tx, rx = links[f"{link}_tx"], links[f"{link}_rx"]
        if tx["mean"] is not None or rx["mean"] is not None:
            words.append(
                f"{label} tx {human_rate(tx['mean'])}/{human_rate(tx['peak'], 'B/s')} "
                f"rx {human_rate(rx['mean'])}/{human_rate(rx['peak'], 'B/s')}"
            )
    return f"links over the {over}, mean/peak: " + ", ".join(words) if words else None


def comparison_lines(comparison: dict[str, Any]) -> list[str]:
    """The comparison as text: each figure of A and B; past :data:`MEMORY_RANKS` ranks, the per-rank peaks of
    the :data:`MEMORY_TOP` ranks whose peak moved most, and a line for the others (``--json`` keeps them all);
    then the ranks and nodes that stand out in each run."""
    lines = [f"A: {comparison['a']}", f"B: {comparison['b']}"]
    lines += [f"warning: {warning}: the comparison is unfair" for warning in comparison["warnings"]]
    lines.append(f"  {'metric':<44}{'A':>14}{'B':>14}{'B / A':>9}")
    metrics, per_rank = comparison["metrics"], [row for row in comparison["metrics"] if _per_rank_peak(row)]
    left_out: list[dict[str, Any]] = []
    if len(per_rank) > MEMORY_RANKS:
        moved = sorted(per_rank, key=lambda row: -abs((row["ratio"] or 1.0) - 1.0))
        left_out = moved[MEMORY_TOP:]
        kept = {id(row) for row in moved[:MEMORY_TOP]}
        metrics = [row for row in metrics if not _per_rank_peak(row) or id(row) in kept]
    for row in metrics:
        ratio = or_dash(row["ratio"], ".3f")
        mark = "  *" if row["significant"] else ""
        lines.append(
            f"  {row['name']:<44}{figure(row['name'], row['a']):>14}{figure(row['name'], row['b']):>14}{ratio:>9}{mark}"
        )
    if left_out:
        ratios = sorted(row["ratio"] for row in left_out if row["ratio"] is not None)
        spread = f": B / A {ratios[0]:.3f} to {ratios[-1]:.3f}" if ratios else ""
        lines.append(
            f"  the other {len(left_out)} ranks' peak memory{spread}, "
            f"{sum(row['significant'] for row in left_out)} moved (--json lists every rank)"
        )
    lines.append("  * beyond run-to-run noise (Mann-Whitney p < 0.01 on the per-step values, and over 1 %)")
    lines += [f"  {line}" for line in comparison.get("failures", [])]
    if comparison.get("moved"):
        lines.append(f"  {comparison['moved']}")
    lines += compared_blocker_lines(comparison.get("blocker"))
    lines += standing_out_lines(comparison.get("standing_out", []))
    return lines


def compared_blocker_lines(compared: dict[str, Any] | None) -> list[str]:
    """``blocker changed: bubble in A, communication in B`` (then B's evidence), ``blocker: bubble in both``;
    none where neither run has one."""
    if compared is None or (compared["a"] is None and compared["b"] is None):
        return []
    a, b = (side["kind"] if side is not None else "none judged" for side in (compared["a"], compared["b"]))
    if not compared["changed"]:
        return [f"  blocker: {a} in both"]
    evidence = [f"    B: {compared['b']['evidence']}"] if compared["b"] is not None else []
    return [f"  blocker changed: {a} in A, {b} in B", *evidence]


def _per_rank_peak(row: dict[str, Any]) -> bool:
    return row["name"].startswith("rank ") and row["name"].endswith(" peak memory (bytes)")


def standing_out_lines(rows: list[dict[str, Any]]) -> list[str]:
    """What stands out in A and in B, a line a measure (``compare``'s ``standing_out``), where either has
    something that does."""
    shown = [row for row in rows if row["verdict"] != "none"]
    if not shown:
        return (
            [f"  no rank or node stands out in either run ({', '.join(LABELS[row['measure']] for row in rows)})"]
            if rows
            else []
        )
    lines = [f"ranks and nodes that stand out (the rank grid's: modified z over {Z_LIMIT:g}):"]
    for row in shown:
        lines.append(
            f"  {LABELS[row['measure']]}: A: {_standing_out_words(row['a'])}; B: {_standing_out_words(row['b'])}"
            f"  [{row['verdict']}]"
        )
    return lines


def _standing_out_words(side: dict[str, Any]) -> str:
    if not side["scored"]:
        return "not measured"
    if not side["nodes"] and not side["flagged_ranks"]:
        return "nothing"
    words = []
    if side["nodes"]:
        words.append("node " + ", ".join(str(node["node"]) for node in side["nodes"]))
    if side["flagged_ranks"]:
        named = ranks_text(rank["rank"] for rank in side["ranks"])
        more = (
            f" and {side['flagged_ranks'] - len(side['ranks'])} more"
            if side["flagged_ranks"] > len(side["ranks"])
            else ""
        )
        words.append(f"{side['flagged_ranks']} rank(s): {named}{more}")
    return ", ".join(words)


def figure(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    if "(bytes)" in name:
        return human_bytes(value)
    if "(s)" in name:
        return seconds(value)
    return f"{value:,.3f}" if value < 1000 else f"{value:,.0f}"
