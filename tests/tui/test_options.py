"""The command line's options: an explicit ``--model`` beside ``--model-config`` is refused, whichever preset it
names (the default's name included: the user asked for both)."""

from __future__ import annotations

import pytest

from tests.kit.commands import one_line_error


@pytest.mark.parametrize("command", [["run"], ["plan", "--ranks", "2"]])
@pytest.mark.parametrize("model", ["tiny", "125m"])
def test_an_explicit_model_beside_a_model_config_is_refused(
    command: list[str], model: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("meshtop.tui.options.gpus_visible", lambda: 0)
    line = one_line_error([*command, "--model", model, "--model-config", "config.json"], capsys)
    assert f"--model {model} and --model-config config.json each name the model: give one of them" in line
