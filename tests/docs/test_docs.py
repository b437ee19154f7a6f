"""The docs cannot drift: every command a user copies from README.md and docs/ runs (or says why it cannot
here), its shown output is what meshtop prints, the option tables are the parsers', and the ``summary --json``
keys the docs name are the ones a recording has (the runner and its rules: tests/kit/docs.py).

The text-only checks (markers, option tables, the planner's tables and a sweep's predictions, a refused plan,
the shipped samples' keys) run in the fast lane; the blocks that launch ranks are slow."""

from __future__ import annotations

import argparse
import io
import itertools
import json
import re
import shlex
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from meshtop.recordings.samples import __file__ as samples_init
from meshtop.runner.presets import PRESETS
from meshtop.tui.cli import build_parser, main
from tests.kit.commands import run_meshtop
from tests.kit.docs import (
    LANGUAGES,
    PAGES,
    ROOT,
    RUN_LANGUAGES,
    Block,
    Shown,
    all_blocks,
    commands,
    differences,
    in_folder,
    missing_programs,
    same_line,
    shell,
    small,
    transcript,
    unknown_markers,
)
from tests.kit.sse_server import stub_server

BLOCKS = all_blocks()
RUN = [block for block in BLOCKS if block.language in RUN_LANGUAGES and block.illustrative is None]
SAMPLES = sorted(path for path in Path(samples_init).parent.iterdir() if (path / "manifest.json").is_file())

OPTION_TABLES = (ROOT / "README.md", ROOT / "docs" / "serving.md", ROOT / "docs" / "inference.md")
CHOICES = {"--model": tuple(PRESETS)}
"""Values an option takes that argparse does not hold: the presets are checked by the plan, so that
``--endpoint`` can name a server's model."""

SUMMARY_SECTION = ("`meshtop summary REC --json` prints:", "`meshtop compare A B [--json]`")
REQUESTS_SECTION = ("The summary's `requests` key holds these", "In inference\n")
NOT_HERE = {"gpus": "NVML, a GPU", "stragglers": "a rank slower than its peers for 10 s of steps"}
"""The summary's sections that no recording made on a CPU machine in a test's time fills: their keys are held
to the docs one way only (every key printed is named)."""


def launches_nothing(block: Block) -> bool:
    """A transcript of ``meshtop plan`` (arithmetic only) or of a plan refused before anything starts."""
    return all(
        shlex.split(shown.command)[1] == "plan" or shown.lines[-1].startswith("meshtop: error:")
        for shown in transcript(block)
    )


def ids(blocks: list[Block]) -> list[str]:
    return [block.where for block in blocks]


FAST = [block for block in RUN if block.language == "console" and launches_nothing(block)]
SLOW = [block for block in RUN if block not in FAST]


def test_every_block_names_its_language() -> None:
    unnamed = [f"{block.where}: ```{block.language}" for block in BLOCKS if block.language not in LANGUAGES]
    assert not unnamed, f"a block's language is one of {LANGUAGES}: {unnamed}"


def test_every_marker_is_known_and_says_why() -> None:
    unknown = [f"{block.where}: {marker}" for block in BLOCKS for marker in unknown_markers(block)]
    assert not unknown, unknown
    misplaced = [block.where for block in BLOCKS if block.illustrative and block.language not in RUN_LANGUAGES]
    assert not misplaced, f"only sh and console blocks are run, so only they are marked illustrative: {misplaced}"


def test_every_shell_block_is_run_or_says_why_not() -> None:
    """The slow and fast tests below run every block that is not marked; an sh block's commands are
    meshtop's or the shell's own (nothing that needs an install or a placeholder filled in)."""
    placeholders = re.compile(r"\b(OUT|REC|A B|URL|MODEL|PATH|train\.py)\b|\.\.\.|\[")
    unrunnable = [
        block.where
        for block in RUN
        for command in (commands(block.text) if block.language == "sh" else [s.command for s in transcript(block)])
        if placeholders.search(command)
    ]
    assert not unrunnable, f"a placeholder cannot run: mark the block <!-- illustrative: why -->: {unrunnable}"
    assert FAST and SLOW


@pytest.mark.parametrize("block", FAST, ids=ids(FAST))
def test_a_plan_transcript_is_what_meshtop_prints(block: Block, tmp_path: Path) -> None:
    """The planner's tables and the refused plans, produced by meshtop here: a formula that changes them
    changes the page, or fails."""
    check_transcript(block, tmp_path)


SWEEPS = [
    (block, shown)
    for block in BLOCKS
    if block.language == "console"
    for shown in transcript(block)
    if " sweep " in shown.command
]


@pytest.mark.parametrize(("block", "shown"), SWEEPS, ids=[block.where for block, _ in SWEEPS])
def test_a_sweep_transcripts_predictions_are_the_planners(block: Block, shown: Shown, tmp_path: Path) -> None:
    """A sweep's measured columns cannot be checked without its jobs (minutes), but its ``pred`` column is
    the planner's: each shown row's prediction is ``meshtop plan``'s total for that plan, today."""
    words = shlex.split(shown.command)
    out, options = words.index("sweep") + 1, words[words.index("sweep") + 2 :]
    if "--steps" in options:
        del options[options.index("--steps") : options.index("--steps") + 2]
    planned = shell(shlex.join(["meshtop", "plan", *options]), tmp_path)
    assert planned.returncode == 0, planned.stdout
    totals = {row[0]: value for row, value in column(planned.stdout, "plan", "total")}
    predicted = {row[1]: value for row, value in column("\n".join(shown.lines), "#", "pred")}
    assert predicted and all(totals[plan] == value for plan, value in predicted.items()), (
        words[out],
        predicted,
        totals,
    )


def column(table: str, first: str, name: str) -> list[tuple[list[str], str]]:
    """Each row of the table whose header starts with ``first`` (up to a blank line or ``...``), with its value
    in column ``name``, counted from the right (a schedule, ``1f1b 4mb``, or a time, ``5.33 s``, is two words)."""
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first])
    header = lines[start].split()
    at = header.index(name) - len(header)
    body = itertools.takewhile(lambda line: line.strip() not in ("", "..."), lines[start + 1 :])
    return [(row, row[at]) for row in map(str.split, body)]


@pytest.mark.slow
@pytest.mark.parametrize("block", SLOW, ids=ids(SLOW))
def test_a_block_runs_and_prints_what_it_shows(block: Block, tmp_path: Path) -> None:
    if block.language == "console":
        check_transcript(block, tmp_path)
        return
    missing = [program for command in commands(block.text) for program in missing_programs(command)]
    if missing:
        pytest.skip(f"{block.where} pipes through {', '.join(missing)}, not installed here")
    script = "\n".join(
        small(in_folder(command, tmp_path), tmp_path, number) for number, command in enumerate(commands(block.text))
    )
    done = shell(script, tmp_path)
    assert done.returncode == 0, f"{block.where}: exit {done.returncode}\n{script}\n{done.stdout[-4000:]}"


def check_transcript(block: Block, folder: Path) -> None:
    for shown in transcript(block):
        done = shell(in_folder(shown.command, folder), folder)
        printed = done.stdout
        missing = differences(tuple(in_folder(line, folder) for line in shown.lines), printed, factor=block.factor)
        assert not missing, f"{block.where}: `{shown.command}` printed\n{printed}\nwithout the lines\n" + "\n".join(
            missing
        )


def test_the_line_check_takes_figures_within_the_stated_factor() -> None:
    assert same_line("step    1/20  loss 5.5542  0.041 s", "step 1/20 loss 5.5542 0.041 s")
    assert not same_line("total 78.0G", "total 86.0G")
    assert same_line("0.041 s  12,500 tok/s", "0.2 s  2,000 tok/s", factor=10)
    assert not same_line("0.041 s", "0.5 s", factor=10)
    assert same_line("ETA 0.0 s", "ETA 0.1 s", factor=10)
    assert not same_line("peak 316.8 MiB", "peak 316.8 KiB", factor=10)


# The option tables ---------------------------------------------------------------------------------------


def run_parser() -> argparse.ArgumentParser:
    """``meshtop run``'s parser (``record``'s holds the same options, and every table documents ``run``)."""
    commands_ = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands_.choices["run"]


def option_rows(page: Path) -> Iterator[tuple[str, list[str]]]:
    """The rows of the page's option tables (``| option | meaning | default |``): where, and the cells."""
    in_table = False
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")] if line.startswith("|") else []
        if cells[:3] == ["option", "meaning", "default"]:
            in_table = True
        elif not cells:
            in_table = False
        elif in_table and not set(cells[0]) <= set("-: "):
            yield f"{page.relative_to(ROOT)}:{number}", cells


def plain(text: str) -> str:
    return " ".join(text.replace("`", "").replace("\\|", "|").split())


def defaults_said(action: argparse.Action) -> list[str]:
    """What the parser says an option's default is: its value, and what its help says in words."""
    said = []
    if isinstance(action, argparse._StoreTrueAction):
        said.append("off")
    elif action.default is not None and not isinstance(action, argparse._StoreFalseAction):
        said.append(f"{action.default:g}" if isinstance(action.default, float) else str(action.default))
    help_ = action.help or ""
    said += re.findall(r"\(default:? ([^;()]*(?:\([^)]*\)[^;()]*)*)", help_)
    said += re.findall(r"([\w.]+) \(default\)", help_)
    said += re.findall(r"\(([\w.]+), the default", help_)
    return [plain(text).rstrip(",") for text in said]


def test_the_option_tables_hold_the_parsers_names_defaults_and_choices() -> None:
    actions = {name: action for action in run_parser()._actions for name in action.option_strings}
    wrong = []
    for where, (name_cell, meaning, default, *_) in (row for page in OPTION_TABLES for row in option_rows(page)):
        names = re.findall(r"`(--[\w-]+)", name_cell)
        defaults = [part.strip() for part in plain(default).split(" / ")] if len(names) > 1 else [plain(default)]
        if len(defaults) != len(names):  # one default said for every option the row names
            defaults = [plain(default)] * len(names)
        for name, stated in zip(names, defaults, strict=True):
            action = actions.get(name)
            if action is None:
                wrong.append(f"{where}: {name} is no option of meshtop run")
                continue
            said = defaults_said(action)
            if said and not any(text in stated for text in said):
                wrong.append(f"{where}: {name}'s default reads {stated!r}; the parser says {said}")
            choices = CHOICES.get(name) or action.choices
            named = set(re.findall(r"`([\w.-]+)`", meaning + " " + default)) - {name}
            metavar = name_cell.split("`")[1].partition(" ")[2]
            if "|" in metavar:  # `--api completions\|chat`
                named |= set(re.split(r"\\?\|", metavar))
            named = {word for word in named if not word.startswith("-")}
            if choices and named and named != set(choices):
                wrong.append(f"{where}: {name} takes {sorted(choices)}, the table says {sorted(named)}")
    assert not wrong, "\n".join(wrong)


def test_every_option_of_run_is_named_in_the_docs() -> None:
    text = "\n".join(page.read_text() for page in PAGES)
    unnamed = [
        name
        for action in run_parser()._actions
        for name in action.option_strings[:1]
        if name != "-h" and not re.search(rf"(?<![\w-]){re.escape(name)}\b", text)
    ]
    assert not unnamed, f"options no page names: {unnamed}"


# The summary's --json keys -------------------------------------------------------------------------------


def summary_of(recording: Path) -> dict[str, Any]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["summary", str(recording), "--json"]) == 0
    return json.loads(out.getvalue())


def keys_of(value: object) -> set[str]:
    """Every key at any depth, but numbers (a mapping by rank holds data, not names)."""
    if isinstance(value, dict):
        return {key for key in value if not key.isdigit()} | {key for item in value.values() for key in keys_of(item)}
    if isinstance(value, list):
        return {key for item in value for key in keys_of(item)}
    return set()


def section(text: str, bounds: tuple[str, str]) -> str:
    start = text.index(bounds[0])
    return text[start : text.index(bounds[1], start)]


def documented_keys() -> tuple[str, dict[str, set[str]]]:
    """docs/recordings.md's account of ``summary --json``: its text, and the keys each of its sections names
    (the first key a bullet names is the section)."""
    text = (ROOT / "docs" / "recordings.md").read_text()
    summary, requests = section(text, SUMMARY_SECTION), section(text, REQUESTS_SECTION)
    named: dict[str, set[str]] = {}
    for bullet in re.split(r"\n- ", summary)[1:]:
        keys = re.findall(r"`([a-z][a-z0-9_]*)`", bullet)
        named.setdefault(keys[0], set()).update(keys)
    named["requests"] = set(re.findall(r"`([a-z][a-z0-9_]*)`", requests))
    return summary + requests, named


def test_every_summary_key_of_the_shipped_samples_is_documented() -> None:
    check_keys_named([summary_of(sample) for sample in SAMPLES])


def check_keys_named(summaries: list[dict[str, Any]]) -> None:
    text, _ = documented_keys()
    printed = set().union(*(keys_of(summary) for summary in summaries))
    unnamed = sorted(key for key in printed if not re.search(rf"\b{key}\b", text))
    assert not unnamed, f"summary --json keys docs/recordings.md does not name: {unnamed}"


ENGINE_METRICS = (
    b"vllm:num_requests_running 2\nvllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.5\n"
    b"vllm:num_preemptions_total 0\nvllm:prompt_tokens_total 64\nvllm:generation_tokens_total 32\n"
)
"""A vLLM server's /metrics: every series meshtop reads by a common name."""


@pytest.mark.slow
def test_every_documented_summary_key_is_in_a_real_recording(recorded: Path, tmp_path: Path) -> None:
    """The shipped samples, a fresh dp2 x pp2 recording (its breakdown and stages) and a load sent to a
    server that streams and publishes vLLM's metrics (the endpoint's keys) hold every key the docs name, but
    those of the sections no CPU recording fills (:data:`NOT_HERE`)."""
    with stub_server(chunks=4, metrics=lambda: ENGINE_METRICS) as server:
        done = run_meshtop("record", tmp_path / "served", "--endpoint", server.url, "--requests", "8")
    assert done.returncode == 0, done.stdout + done.stderr
    summaries = [summary_of(recording) for recording in (*SAMPLES, recorded, tmp_path / "served")]
    check_keys_named(summaries)
    printed = set().union(*(keys_of(summary) for summary in summaries))
    _, named = documented_keys()
    absent = {name: sorted(keys - printed) for name, keys in named.items() if name not in NOT_HERE and keys - printed}
    assert not absent, f"keys docs/recordings.md names that no summary --json printed: {absent}"
