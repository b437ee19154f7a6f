"""The dashboard's widgets and modal screens: the header and replay bars, help, the hang report, a prompt."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from meshtop.probes.events import HangDetected
from meshtop.tui.alerts import alerts_of
from meshtop.tui.requests_lines import output_rate
from meshtop.tui.sources import Source
from meshtop.tui.state import DashboardState
from meshtop.tui.summary_text import human_seconds, per_second

STATUS_COLOURS = {
    "running": "green",
    "completed": "green",
    "replaying": "cyan",
    "failed": "bold red",
    "interrupted": "yellow",
    "stopping": "yellow",
}
"""The colour of the session's status in the header (any other: white)."""


class HeaderBar(Static):
    """Plan, model, device, step, step time, tokens/s, MFU (inference: requests, req/s, TTFT p50, output
    tokens/s), elapsed, status and recording path."""

    def show(self, state: DashboardState, status: str, extra: str = "") -> None:
        info = state.info
        if info.model is not None:
            params = info.model.parameter_count()
            size = f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"
            what = f"{info.model.name} {size} · {info.world_size}× {info.device} {info.dtype}"
        elif info.endpoint is not None:
            what = f"model {info.endpoint.model} · meshtop's load generator"
        else:
            what = f"{info.world_size}× {info.device}"
        first = Text(no_wrap=True, overflow="ellipsis")
        first.append(" meshtop ", style="bold reverse")
        first.append(f" ● {status} ", style=STATUS_COLOURS.get(status, "white"))
        first.append(f" {info.plan.label} · {what}")
        second = Text(no_wrap=True, overflow="ellipsis")
        if extra:
            second.append(f" [{extra}]", style="bold yellow")
        if (phase := state.startup()) is not None:
            second.append(f" {phase}…", style="bold")
        elif info.inference:
            self._requests(second, state)
        else:
            self._steps(second, state)
        second.append(
            f"  elapsed {human_seconds(state.elapsed_s) if state.elapsed_s >= 1 else f'{state.elapsed_s:.1f} s'}"
        )
        if info.until_stopped and status == "running":
            second.append("  q ends the run", style="bold")
        alerts = [alert for alert in alerts_of(state) if alert.severity != "info"]  # a warning's sign: no info's
        if alerts:
            worst = alerts[0]
            second.append(f"  ⚠ {len(alerts)}", style="bold red" if worst.severity == "error" else "yellow")
        if state.recording:
            second.append(f"  rec {state.recording}", style="dim")
        header = Text("\n").join([first, second])
        header.no_wrap, header.overflow = True, "ellipsis"
        self.update(header, layout=False)  # two rows always: no need to lay the screen out again

    @staticmethod
    def _steps(line: Text, state: DashboardState) -> None:
        """Training: the step, its time, tokens/s and MFU."""
        step = state.steps[-1] if state.steps else None
        total = f"/{state.info.steps}" if state.info.steps else ""
        line.append(f" step {state.steps_done}{total}", style="bold")
        line.append(f"  {human_seconds(step.duration_s) if step else '-'}")
        rate = state.figures().steps.tokens_per_s  # the job steps' p50, the summary's figure
        line.append(f"  p50 {rate:,.0f} tok/s" if rate is not None else "  - tok/s")
        mfu = state.mfu().value
        if mfu is not None:
            line.append(f"  MFU {mfu:.1%}")

    @staticmethod
    def _requests(line: Text, state: DashboardState) -> None:
        """Inference: requests done, req/s and TTFT p50 (no loss or MFU: nothing is trained)."""
        view = state.requests_view()
        if view is None:
            return
        figures = view.figures
        total = f"/{view.total:,}" if view.total is not None else ""
        line.append(f" requests {figures.completed:,}{total}", style="bold")
        if figures.failed:
            line.append(f" ({figures.failed} failed)", style="yellow")
        line.append(f"  {per_second(figures.request_throughput_per_s, 'req/s')}")
        line.append(f"  TTFT p50 {human_seconds(view.p50_p99('ttft_s')[0])}")
        line.append(f"  {output_rate(figures.output_tokens_per_s)}")


class ReplayBar(Static):
    """The replay's position: a bar to click, the step, the speed and whether it is paused."""

    source: Source | None = None
    """The one it shows (a click seeks it)."""

    def show(self, source: Source) -> None:
        self.source = source
        playback = source.playback
        if playback is None:
            self.display = False
            return
        width = max(10, self.size.width - 40)
        filled = int(playback.fraction * width)
        text = Text()
        text.append(" ■ " if playback.at_end else " ⏸ " if playback.paused else " ▶ ", style="bold")
        text.append("━" * filled, style="cyan")
        text.append("─" * (width - filled), style="#444444")
        step = playback.current_step()
        text.append(f" step {step + 1 if step is not None else 0}/{playback.steps}")
        text.append(f"  {(playback.position_ns - playback.start_ns) / 1e9:.1f} s  {playback.speed:g}x")
        self.update(text, layout=False)  # one row always

    def on_click(self, event: events.Click) -> None:
        playback = self.source.playback if self.source is not None else None
        width = max(10, self.size.width - 40)
        if playback is not None and 3 <= event.x < 3 + width:
            playback.seek_fraction((event.x - 3) / width)


class HelpScreen(ModalScreen[None]):
    """Every key of the dashboard, from the bindings themselves."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 64; height: auto; max-height: 90%; border: round $accent; background: $panel; padding: 0 1;
    }
    """

    def __init__(self, bindings: Iterable[Binding], *, replay: bool) -> None:
        super().__init__()
        self.keys = list(bindings)
        self.replay = replay

    def compose(self) -> ComposeResult:
        text = Text("Keys", style="bold")
        text.append("  (q, ? or escape closes this help)\n\n", style="dim")
        views = [binding for binding in self.keys if binding.action.startswith("view(")]
        for binding in self.keys:
            if binding in views:  # one row for them all, where the first one was
                if binding is views[0]:
                    text.append(f"{views[0].key + '-' + views[-1].key:<18}", style="bold cyan")
                    text.append("Views, as the tabs number them\n")
                continue
            keys = ", ".join(KEY_NAMES.get(key, key) for key in binding.key.split(","))
            text.append(f"{keys:<18}", style="bold cyan")
            text.append(f"{binding.description}\n")
        text.append("\nctrl+p            command palette (every action by name)\n", style="dim")
        text.append(
            f"mouse             tabs, {'the replay bar, ' if self.replay else ''}footer keys; scroll", style="dim"
        )
        with VerticalScroll():
            yield Static(text)


class HangScreen(ModalScreen[bool]):
    """No rank made progress: where each rank is, and the choice to stop the job or keep waiting."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "choose(True)", "Stop the job"),
        Binding("w,escape", "choose(False)", "Keep waiting"),
    ]
    DEFAULT_CSS = """
    HangScreen { align: center middle; }
    HangScreen > VerticalScroll {
        width: 90%; height: auto; max-height: 90%; border: round $error; background: $panel; padding: 0 1;
    }
    """

    def __init__(self, hang: HangDetected) -> None:
        super().__init__()
        self.hang = hang

    def compose(self) -> ComposeResult:
        text = Text(
            f"No rank made progress for {self.hang.silent_s:.0f} s (hang timeout {self.hang.timeout_s:.0f} s)\n\n",
            style="bold red",
        )
        lines = self.hang.report.splitlines()
        text.append(lines[0] + "\n", style="bold")
        text.append("\n".join(lines[1:]) + "\n\n")
        text.append("Every rank's stack was dumped with py-spy (view 6, and the recording).\n\n", style="dim")
        text.append("s", style="bold cyan")
        text.append(" stop the job (recorded as failed: hang)    ")
        text.append("w", style="bold cyan")
        text.append(" keep waiting (asked again after another timeout)")
        with VerticalScroll():
            yield Static(text)

    def action_choose(self, stop: bool) -> None:
        self.dismiss(stop)


class PromptScreen(ModalScreen[str | None]):
    """One line of input (the rank filter, a seek target); Enter gives it, Escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    PromptScreen { align: center bottom; }
    PromptScreen > Vertical { width: 70; height: auto; border: round $accent; background: $panel; margin-bottom: 2; }
    """

    def __init__(self, prompt: str, value: str = "") -> None:
        super().__init__()
        self.prompt, self.value = prompt, value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.prompt)
            yield Input(value=self.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


KEY_NAMES = {
    "question_mark": "?",
    "slash": "/",
    "plus": "+",
    "minus": "-",
    "left": "←",
    "right": "→",
    "up": "↑",
    "down": "↓",
    "equals_sign": "=",
}
"""How the help writes a key whose Textual name is not how it reads (any other key: its name)."""
