"""The capacity search (runner/planner/capacity.py's next_rate), stepped by hand: each sequence of rates worked
out from the module's rule for a server whose runs pass at and below a known capacity, and the configurations
--vary makes (labels, folders, GPUs) worked out by hand."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from meshtop.runner.errors import PlanError
from meshtop.runner.planner.capacity import (
    Outcome,
    configurations,
    fill,
    gpu_shares,
    next_rate,
    parse_rates,
)


def searched(
    passes: Callable[[float], bool],
    *,
    fixed: tuple[float, ...] | None = None,
    saturates: Callable[[float], bool] = lambda rate: False,
    **options: float,
) -> list[float]:
    """The rates the search runs, in order, against a server that passes where ``passes`` says."""
    outcomes: list[Outcome] = []
    while (rate := next_rate(outcomes, fixed=fixed, **options)) is not None:  # type: ignore[arg-type]
        outcomes.append(Outcome(rate=rate, passed=passes(rate), saturated=saturates(rate)))
        assert len(outcomes) < 50
    return [outcome.rate for outcome in outcomes]


def test_auto_doubles_to_the_first_failure_then_bisects_to_within_a_tenth() -> None:
    """Capacity 4.5: 1, 2, 4 pass, 8 fails; bisect (4, 8) -> 6 fails, (4, 6) -> 5 fails, (4, 5) -> 4.5 passes,
    (4.5, 5): 0.5 / 4.5 = 11 % > 10 % -> 4.75 fails, (4.5, 4.75): 0.25 / 4.5 = 5.6 % -> done at 4.5."""
    rates = searched(lambda rate: rate <= 4.5)
    assert rates == [1, 2, 4, 8, 6, 5, 4.5, 4.75]
    assert max(rate for rate in rates if rate <= 4.5) == 4.5


def test_auto_starts_where_asked_and_stops_at_a_tenth_exactly() -> None:
    """Start 10, capacity 10.5: 10 passes, 20 fails, 15 fails, 12.5 fails, 11.25 fails: 1.25 / 10 = 12.5 % ->
    10.62 (10.625 to 4 digits) fails: 0.62 / 10 = 6.2 % -> done at 10."""
    assert searched(lambda rate: rate <= 10.5, start=10) == [10, 20, 15, 12.5, 11.25, 10.62]
    # a pass and a failure 10 % apart: done at once (the rule is <= 10 %)
    assert (
        next_rate(
            [Outcome(rate=10, passed=True, saturated=False), Outcome(rate=11, passed=False, saturated=False)],
            fixed=None,
        )
        is None
    )


def test_auto_halves_at_most_four_times_when_the_start_does_not_pass() -> None:
    """No pass at 1, 0.5, 0.25, 0.125, 0.0625 (the start and four halvings): capacity 0, no sixth run."""
    assert searched(lambda rate: False) == [1, 0.5, 0.25, 0.125, 0.0625]
    # a pass on the way down is bisected up: capacity 0.3 -> 1 F, 0.5 F, 0.25 P, 0.375 F, 0.3125 F,
    # (0.25, 0.3125): 25 % -> 0.2812 P (0.28125 to 4 digits), 0.3125 / 0.2812 - 1 = 11 % -> 0.2969 P, 5.3 % -> done
    assert searched(lambda rate: rate <= 0.3) == [1, 0.5, 0.25, 0.375, 0.3125, 0.2812, 0.2969]


def test_auto_runs_at_most_max_runs() -> None:
    assert searched(lambda rate: True, max_runs=3) == [1, 2, 4]
    assert searched(lambda rate: True, max_runs=5, start=0.5) == [0.5, 1, 2, 4, 8]


def test_fixed_rates_run_ascending_and_stop_once_one_saturates() -> None:
    """4,1,8,2 run as 1, 2, 4, 8; a run that misses its SLO does not stop them, a saturated one does."""
    assert searched(lambda rate: rate <= 2, fixed=(4, 1, 8, 2)) == [1, 2, 4, 8]
    assert searched(lambda rate: rate <= 2, fixed=(4, 1, 8, 2), saturates=lambda rate: rate >= 4) == [1, 2, 4]
    assert searched(lambda rate: True, fixed=(3,), saturates=lambda rate: True) == [3]


def test_rates_and_concurrencies_are_checked_in_one_line() -> None:
    assert parse_rates("1,2.5,4", "--rates") == (1, 2.5, 4)
    assert parse_rates("2,8", "--concurrencies", whole=True) == (2, 8)
    for text, whole in (("1,x", False), ("0,1", False), ("", False), ("1.5", True), ("-1", False), ("nan", False)):
        with pytest.raises(PlanError, match="above 0 separated by commas"):
            parse_rates(text, "--rates", whole=whole)
    with pytest.raises(PlanError, match="given twice"):
        parse_rates("1,1", "--rates")


COMMAND = ("vllm", "serve", "m", "--tensor-parallel-size", "{tp}", "--port", "{port}")
ENDPOINT = "http://127.0.0.1:{port}"


def test_vary_makes_every_combination_in_the_order_given_with_its_gpus() -> None:
    """tp=1,2 x replicas=1,2: tp=1,replicas=1 (1 GPU), tp=1,replicas=2 (2), tp=2,replicas=1 (2), tp=2,replicas=2
    (4); their folders tp-1_replicas-1 ...; without tp or pp a server holds --gpus-per-config."""
    found = configurations(["tp=1,2", "replicas=1,2"], COMMAND, ENDPOINT, gpus_per_config=3)
    assert [(c.label, c.folder, c.gpus, c.replicas) for c in found] == [
        ("tp=1,replicas=1", "tp-1_replicas-1", 1, 1),
        ("tp=1,replicas=2", "tp-1_replicas-2", 2, 2),
        ("tp=2,replicas=1", "tp-2_replicas-1", 2, 1),
        ("tp=2,replicas=2", "tp-2_replicas-2", 4, 2),
    ]
    batch = configurations(["batch=8,16"], ("serve", "--max-batch", "{batch}"), "http://h:8000", gpus_per_config=2)
    assert [(c.label, c.gpus) for c in batch] == [("batch=8", 2), ("batch=16", 2)]
    assert [(c.label, c.folder, c.gpus) for c in configurations([], None, "http://h:8000", gpus_per_config=1)] == [
        ("endpoint", "endpoint", 1)
    ]
    assert fill(" ".join(COMMAND), found[2].values, 8123) == "vllm serve m --tensor-parallel-size 2 --port 8123"
    assert gpu_shares(("0", "1", "2", "3"), 2) == ["0,1", "2,3"]
    assert gpu_shares((), 2) == [None, None]


@pytest.mark.parametrize(
    ("vary", "command", "said"),
    [
        (["replicas=1,2"], ("serve", "--port", "8000"), "needs a port of its own: put {port}"),
        (["tp=1,2"], ("serve", "--port", "{port}"), "--vary tp: the server command has no {tp} to fill"),
        (["tp=1,2"], None, "give the command after --"),
        (["tp"], COMMAND, "give NAME=V1,V2"),
        (["tp=1,"], COMMAND, "give NAME=V1,V2"),
        (["tp=1", "tp=2"], COMMAND, "is given twice"),
        (["port=1,2"], COMMAND, "meshtop's own"),
        (["replicas=1"], COMMAND, "{tp} in the server command is not varied"),
        (["tp=one"], COMMAND, "take whole numbers"),
        (["t-p=1,2"], COMMAND, "give NAME=V1,V2"),
        (["replicas=0,1"], ("serve", "{port}"), "--vary replicas=0: give 1 or more"),
        (["tp=1,0"], COMMAND, "--vary tp=0: give 1 or more"),
        (["tp=2", "pp=-1"], ("serve", "{tp}", "{pp}"), "--vary pp=-1: give 1 or more"),
    ],
)
def test_a_wrong_vary_is_one_line(vary: list[str], command: tuple[str, ...] | None, said: str) -> None:
    with pytest.raises(PlanError, match=None) as raised:
        configurations(vary, command, ENDPOINT, gpus_per_config=1)
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_auto_stops_at_twelve_runs_by_default() -> None:
    """A server that passes everything: 1 doubled eleven times, 2,048, is the twelfth and last run."""
    assert searched(lambda rate: True) == [2.0**n for n in range(12)]


def test_each_replica_gets_its_share_of_the_visible_gpus() -> None:
    """3 GPUs over 2 replicas: 3 // 2 = 1 each (the third unused); 1 GPU over 2: 1 each at least, the second
    replica left none of its own (the environment as it is)."""
    assert gpu_shares(("0", "1", "2"), 2) == ["0", "1"]
    assert gpu_shares(("0",), 2) == ["0", None]
    assert fill("serve --port {port} {tp}", (("tp", "2"),), None) == "serve --port {port} 2"


def test_the_rate_lists_say_what_they_take() -> None:
    """The whole words of each refusal: infinity is no rate; concurrencies are whole numbers."""
    for text in ("inf", "1,inf"):
        with pytest.raises(PlanError) as raised:
            parse_rates(text, "--rates")
        assert str(raised.value) == f"--rates {text!r}: give numbers above 0 separated by commas, such as --rates 1,2,4"
    with pytest.raises(PlanError) as raised:
        parse_rates("2.5", "--concurrencies", whole=True)
    assert str(raised.value) == (
        "--concurrencies '2.5': give whole numbers above 0 separated by commas, such as --concurrencies 1,2,4"
    )


def test_pp_counts_gpus_as_tp_does_and_a_value_may_hold_an_equals_sign() -> None:
    """tp=2 x pp=2: 4 GPUs a server; pp=2 alone: 2 (not --gpus-per-config's 3); the endpoint as given fills
    nothing. A value after the first = is the value whole: opt=x=1 fills {opt} with x=1."""
    both = configurations(["tp=2", "pp=2"], ("serve", "{tp}", "{pp}"), ENDPOINT, gpus_per_config=3)
    assert [(c.label, c.gpus) for c in both] == [("tp=2,pp=2", 4)]
    assert [c.gpus for c in configurations(["pp=2"], ("serve", "{pp}"), ENDPOINT, gpus_per_config=3)] == [2]
    (endpoint,) = configurations([], None, ENDPOINT, gpus_per_config=1)
    assert (endpoint.values, endpoint.replicas) == ((), 1)
    opts = configurations(["opt=x=1,x=2"], ("serve", "--{opt}"), ENDPOINT, gpus_per_config=1)
    assert [(c.label, c.values) for c in opts] == [("opt=x=1", (("opt", "x=1"),)), ("opt=x=2", (("opt", "x=2"),))]


def test_the_whole_words_of_a_vary_without_a_command_or_of_words() -> None:
    with pytest.raises(PlanError) as raised:
        configurations(["tp=1,2"], None, ENDPOINT, gpus_per_config=1)
    assert str(raised.value) == "--vary fills {NAME} in a server command: give the command after --"
    with pytest.raises(PlanError) as raised:
        configurations(["tp=one"], COMMAND, ENDPOINT, gpus_per_config=1)
    assert str(raised.value) == "--vary replicas, tp and pp take whole numbers"
