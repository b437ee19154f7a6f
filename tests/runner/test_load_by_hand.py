"""The endpoint load of runner/serving/load.py against values written down by hand: the lines of ``load.jsonl``,
the prompts file's shapes and each of its faults in the user's words, the seeded plan, and every option's
bounds, the bound itself on both sides."""

from __future__ import annotations

import codecs
import locale
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshtop.recordings.manifest import Load
from meshtop.runner.errors import PlanError
from meshtop.runner.load import PlannedRequest, arrival_offsets_s
from meshtop.runner.serving import load as load_module
from meshtop.runner.serving.load import (
    MAX_REQUESTS,
    Prompt,
    check_load,
    endpoint_load,
    plan_load,
    prompt_of,
    read_prompts,
    request_from_json,
    request_to_json,
    requests_for,
)

# -- load.jsonl ---------------------------------------------------------------------------------------------


def test_a_load_line_holds_a_text_as_prompt_and_chat_messages_by_their_openai_names() -> None:
    text = PlannedRequest(id=3, prompt=Prompt(text="a b"), output_len=16, offset_s=0.25)
    assert request_to_json(text) == {"id": 3, "prompt": "a b", "max_tokens": 16, "offset_s": 0.25, "warmup": False}
    chat = PlannedRequest(
        id=0, prompt=Prompt(messages=(("system", "be brief"), ("user", "hi"))), output_len=8, offset_s=None, warmup=True
    )
    assert request_to_json(chat) == {
        "id": 0,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "offset_s": None,
        "warmup": True,
    }


def test_a_load_line_without_a_warmup_key_is_one_of_the_loads_own_requests() -> None:
    assert request_from_json({"id": 7, "prompt": "q", "max_tokens": 4}) == PlannedRequest(
        id=7, prompt=Prompt(text="q"), output_len=4, offset_s=None, warmup=False
    )


# -- prompts -------------------------------------------------------------------------------------------------


def test_a_chat_message_keeps_its_role_and_one_without_a_role_is_the_users() -> None:
    record = {"messages": [{"role": "system", "content": "s"}, {"content": "q"}]}
    assert prompt_of(record) == Prompt(messages=(("system", "s"), ("user", "q")))


def test_a_sharegpt_turn_from_user_is_a_human_turn() -> None:
    record = {"conversations": [{"from": "gpt", "value": "a"}, {"from": "user", "value": "q"}]}
    assert prompt_of(record) == Prompt(text="q")


@pytest.mark.parametrize(
    ("record", "words"),
    [
        ([{"prompt": "a"}], "not a JSON object"),
        ({"messages": []}, "no 'prompt', 'messages' or 'conversations'"),  # no messages: not a chat prompt
        ({"messages": [{"role": "user", "content": 5}]}, "a message without a text 'content'"),
        ({"messages": ["hi"]}, "a message without a text 'content'"),
    ],
)
def test_a_record_without_a_prompt_says_what_it_lacks(record: object, words: str) -> None:
    with pytest.raises(ValueError) as raised:
        prompt_of(record)
    assert str(raised.value) == words


def test_each_fault_of_a_prompts_file_is_one_line_naming_the_file_and_the_place(tmp_path: Path) -> None:
    faults = {
        "number.jsonl": ('{"prompt": "a"}\n5\n', "line 2: not a JSON object"),
        "array.json": ("[nope", "not JSON: Expecting value: line 1 column 2 (char 1)"),
        "content.jsonl": ('{"messages": [{"content": null}]}\n', "line 1: a message without a text 'content'"),
    }
    for name, (text, words) in faults.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(PlanError) as raised:
            read_prompts(path)
        assert str(raised.value) == f"--prompts {path}: {words}"
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(PlanError) as raised:
        read_prompts(missing)
    assert str(raised.value) == f"--prompts {missing}: No such file or directory"  # the reason, not the errno


def test_a_sharegpt_array_after_blank_lines_is_still_an_array(tmp_path: Path) -> None:
    path = tmp_path / "sharegpt.json"
    path.write_text('\n  \n[{"conversations": [{"from": "human", "value": "q"}]}]\n')
    assert read_prompts(path) == [Prompt(text="q")]


def test_a_prompts_file_at_the_size_limit_is_read_and_one_byte_more_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(load_module, "MAX_PROMPTS_BYTES", 16)
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "ab"}')  # 16 bytes
    assert read_prompts(path) == [Prompt(text="ab")]
    path.write_text('{"prompt": "abc"}')  # 17
    with pytest.raises(PlanError) as raised:
        read_prompts(path)
    assert str(raised.value) == f"--prompts {path}: 17 bytes, more than 16: use a smaller file"


def test_a_prompts_file_is_read_as_utf8_in_an_ascii_locale_too(tmp_path: Path) -> None:
    """In the C locale with Python's UTF-8 mode off, the locale's encoding is ASCII: the file is UTF-8 all the
    same (the C locale's default would refuse "café" as not UTF-8)."""
    path = tmp_path / "prompts.jsonl"
    path.write_bytes('{"prompt": "café"}\n'.encode())
    script = (
        "import sys; from pathlib import Path; from meshtop.runner.serving.load import read_prompts; "
        "sys.exit(0 if read_prompts(Path(sys.argv[1]))[0].text == 'caf\\xe9' else 3)"
    )
    env = {**os.environ, "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    done = subprocess.run(
        [sys.executable, "-X", "utf8=0", "-c", script, str(path)], env=env, capture_output=True, timeout=30
    )
    assert done.returncode == 0, done.stderr.decode("ascii", "replace")[-500:]


def test_a_prompts_file_is_read_as_utf8_while_this_process_is_in_the_c_locale(tmp_path: Path) -> None:
    """The same rule in this process (the test above reads in a child, which a run that follows which tests
    call ``read_prompts`` does not see): LC_CTYPE set to "C" for the read, with Python's UTF-8 mode off, makes
    the locale's encoding ASCII, and "café" (its é the two bytes C3 A9) is read all the same."""
    if sys.flags.utf8_mode:
        pytest.skip("in Python's UTF-8 mode the locale's encoding is never used")
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"prompt": "caf\xc3\xa9"}\n')
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        assert codecs.lookup(locale.getpreferredencoding(False)).name == "ascii"
        assert read_prompts(path) == [Prompt(text="caf\u00e9")]
    finally:
        locale.setlocale(locale.LC_CTYPE, before)


# -- the seeded plan -----------------------------------------------------------------------------------------
#
# The same options and seed give the same load on any machine: the prompts and lengths from Python's Mersenne
# Twister seeded 2 x seed, the arrivals from one seeded 2 x seed + 1 (their own stream). The draws below are
# that generator's for seeds 2 and 3, written down once.


def test_seed_1_sends_at_the_exponential_gaps_of_the_generator_seeded_3() -> None:
    """Burstiness 1: gamma of shape 1, an exponential gap -ln(1 - u) / rate. random.Random(3)'s first draws u:
    0.23796462709189137, 0.5442292252959519, 0.36995516654807925; at 2 a second: gaps -ln(0.76203537) / 2 =
    0.1358812, -ln(0.45577077) / 2 = 0.3928826 and -ln(0.63004483) / 2 = 0.2309822: sent at 0.1358812,
    0.5287638 and 0.7597459 s."""
    load = Load(requests=3, concurrency=None, request_rate_per_s=2.0, seed=1)
    assert arrival_offsets_s(load) == pytest.approx([0.1358812, 0.5287638, 0.7597459], abs=1e-7)
    assert arrival_offsets_s(Load(requests=1, concurrency=None, request_rate_per_s=2.0, seed=0)) == (
        pytest.approx([0.0721455], abs=1e-7)  # seed 0: random.Random(1)'s first draw 0.1343642441: -ln(0.8656358) / 2
    )


def test_seed_1_draws_its_prompts_and_lengths_from_the_generator_seeded_2() -> None:
    """random.Random(2), drawn in the plan's order (a request's words, the words themselves, its max_tokens):
    1 word "or", 4 tokens (the warmup); 2 words "she letter", 6 tokens; 2 words "must then", 8 tokens."""
    load = Load(
        requests=2, concurrency=1, request_rate_per_s=None, warmup=1, prompt_len=(1, 3), output_len=(4, 8), seed=1
    )
    assert plan_load(load) == [
        PlannedRequest(id=0, prompt=Prompt(text="or"), output_len=4, offset_s=None, warmup=True),
        PlannedRequest(id=1, prompt=Prompt(text="she letter"), output_len=6, offset_s=None),
        PlannedRequest(id=2, prompt=Prompt(text="must then"), output_len=8, offset_s=None),
    ]


def test_an_open_loop_for_a_duration_plans_a_quarter_more_than_rate_times_duration_and_ten() -> None:
    assert requests_for(10.0, 2.0, None) == 35  # 2 / s x 10 s = 20, x 1.25 = 25, + 10
    assert requests_for(4.0, 0.3, None) == 12  # 0.3 x 4 = 1.2, x 1.25 = 1.5, up to 2, + 10


def test_an_endpoint_load_fills_its_timeout_its_shape_and_its_most_in_flight() -> None:
    """A closed loop of 3 clients: the default 120 s timeout, no gamma shape (answers pace it), max_batch 3.
    An open loop: shape 1 (Poisson) where none was given, max_batch 0 (no bound of meshtop's); given values
    stay."""
    closed = endpoint_load(Load(requests=4, concurrency=3, request_rate_per_s=None))
    assert (closed.timeout_s, closed.burstiness, closed.max_batch) == (120.0, None, 3)
    opened = endpoint_load(Load(requests=4, concurrency=None, request_rate_per_s=2.0))
    assert (opened.timeout_s, opened.burstiness, opened.max_batch) == (120.0, 1.0, 0)
    given = endpoint_load(Load(requests=4, concurrency=None, request_rate_per_s=2.0, burstiness=0.5, timeout_s=9.0))
    assert (given.timeout_s, given.burstiness) == (9.0, 0.5)
    with pytest.raises(PlanError, match="--burstiness must be above 0"):
        endpoint_load(Load(requests=4, concurrency=None, request_rate_per_s=2.0, burstiness=0.0))


# -- the options' bounds -------------------------------------------------------------------------------------

BASE = {"requests": 4, "concurrency": 2, "request_rate_per_s": None}


@pytest.mark.parametrize(
    "changes",
    [
        {"requests": MAX_REQUESTS},
        {"concurrency": 1},
        {"concurrency": 100_000},
        {"duration_s": 0.5},
        {"duration_s": 86_400.0},
        {"warmup": MAX_REQUESTS},
    ],
)
def test_a_load_at_its_bounds_is_accepted(changes: dict[str, object]) -> None:
    check_load(Load(**{**BASE, **changes}))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"requests": MAX_REQUESTS + 1}, "--requests must be 1 to 1,000,000, got 1000001"),
        ({"concurrency": 100_001}, "--concurrency must be 1 to 100,000, got 100001"),
        (
            {"request_rate_per_s": 3.0},
            "--concurrency (closed loop) and --request-rate (open loop) exclude each other: give one",
        ),
        ({"slo_ttft_ms": 0.0}, "--slo-ttft-ms must be above 0, got 0"),
        ({"slo_tpot_ms": -2.5}, "--slo-tpot-ms must be above 0, got -2.5"),
        ({"slo_tpot_ms": math.nan}, "--slo-tpot-ms must be above 0, got nan"),
        ({"duration_s": 0.0}, "--duration must be above 0 and at most 86400 seconds, got 0"),
        ({"duration_s": 86_401.0}, "--duration must be above 0 and at most 86400 seconds, got 86401"),
        ({"warmup": MAX_REQUESTS + 1}, "--warmup must be 0 to 1,000,000, got 1000001"),
    ],
)
def test_a_load_past_a_bound_is_refused_naming_its_option(changes: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError) as raised:
        check_load(Load(**{**BASE, **changes}))  # type: ignore[arg-type]
    assert str(raised.value) == message
