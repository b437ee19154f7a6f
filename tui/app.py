"""The Textual app: one dashboard for a live job or a replay, redrawn at a fixed rate from the state."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, TabbedContent, TabPane

from meshtop.probes.errors import MeshtopError
from meshtop.probes.events import HangDetected
from meshtop.tui.filters import every_rank, parse_rank_filter
from meshtop.tui.gc_pacing import GcPacer
from meshtop.tui.rank_grid import GridPanel
from meshtop.tui.sources import Playback, Source
from meshtop.tui.state import LIVE_FIGURES_EVERY_S, DashboardState
from meshtop.tui.terminal import TerminalGuard
from meshtop.tui.view_records import RankView
from meshtop.tui.views import (
    AlertsPanel,
    CollectivesPanel,
    DevicesPanel,
    OverviewPanel,
    Panel,
    PipelinePanel,
    ProcessesPanel,
    StepsPanel,
)
from meshtop.tui.widgets import HangScreen, HeaderBar, HelpScreen, PromptScreen, ReplayBar

FRAME_HZ = 8.0
"""Redraws per second, whatever the event rate."""
GC_EVERY_S = 1.0
"""A paced garbage collection this often, between two frames (tui/gc_pacing.py): each pause is as long as
what came since the last is large, so short pauses often keep each one short (docs/benchmarks.md); the one over
everything comes every :data:`WHOLE_GC_EVERY_S`."""
WHOLE_GC_EVERY_S = 60.0
"""How often a paced collection also looks at the objects the earlier ones froze (their cycles)."""

VIEWS: tuple[tuple[str, str, type[Panel]], ...] = (
    ("overview", "Overview", OverviewPanel),
    ("devices", "Devices", DevicesPanel),
    ("collectives", "Comms", CollectivesPanel),
    ("pipeline", "Pipeline", PipelinePanel),
    ("steps", "Steps", StepsPanel),
    ("processes", "Procs", ProcessesPanel),
    ("alerts", "Alerts", AlertsPanel),
    ("grid", "Grid", GridPanel),
)


@dataclass(frozen=True)
class DashboardWidgets:
    header: HeaderBar
    replay_bar: ReplayBar
    tabs: TabbedContent
    panels: dict[str, Panel]
    """By view name."""


class MeshtopApp(App[None]):
    """The dashboard. It takes its source in the constructor, so tests and benchmarks build the same app."""

    TITLE = "meshtop"
    CSS = """
    HeaderBar { height: 2; background: $boost; text-wrap: nowrap; text-overflow: ellipsis; }
    ReplayBar { height: 1; background: $boost; }
    TabbedContent { height: 1fr; }
    TabPane { padding: 0 1; }
    /* Room for the scrollbar always: a view that grows taller than the screen would otherwise narrow by
       the bar's width, and every panel would be built and laid out a second time at the new width. */
    TabPane > VerticalScroll { scrollbar-gutter: stable; }
    """
    # Priority bindings so the focused tab bar or scroller does not take the keys first; check_action
    # turns them off (and lets the key through) where they do not apply, such as in a prompt.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit", priority=True),
        Binding("ctrl+c", "interrupt", "Quit (also while typing)", show=False, priority=True),
        Binding("question_mark", "help", "Help"),
        *(
            Binding(str(n), f"view('{view}')", f"View: {label}", show=False)
            for n, (view, label, _) in enumerate(VIEWS, 1)
        ),
        Binding("tab", "cycle_view(1)", "Next view", priority=True),
        Binding("shift+tab", "cycle_view(-1)", "Previous view", show=False, priority=True),
        Binding("slash", "filter", "Filter"),
        Binding("s", "stacks(False)", "Stack of rank (Procs view)", show=False),
        Binding("S", "stacks(True)", "Stacks of all ranks (Procs view)", show=False),
        Binding("up", "select_rank(-1)", "Previous rank (Procs view)", show=False, priority=True),
        Binding("down", "select_rank(1)", "Next rank (Procs view)", show=False, priority=True),
        Binding("m", "grid_measure", "Measure (Grid view)", show=False),
        Binding("a", "grid_attention", "Attention only (Grid view)", show=False),
        Binding("enter", "open_rank", "Open the chosen rank (Grid view)", show=False),
        Binding("space", "playback('toggle_pause')", "Pause", priority=True),
        Binding("left", "playback('step_back')", "Step back", show=False, priority=True),
        Binding("right", "playback('step_forward')", "Step", show=False, priority=True),
        Binding("minus", "playback('slower')", "Slower", show=False, priority=True),
        Binding("plus,equals_sign", "playback('faster')", "Faster", show=False, priority=True),
        Binding("g", "seek", "Seek", priority=True),
        Binding("home", "playback('to_start')", "Start", show=False, priority=True),
        Binding("end", "playback('to_end')", "End", show=False, priority=True),
        Binding("k", "stop_job", "Stop the job", priority=True),
        Binding("d", "detach", "Detach", priority=True),
    ]
    REPLAY_ACTIONS = frozenset({"playback", "seek"})
    VIEWER_ACTIONS = frozenset({"stop_job"})
    """A viewer's only (``meshtop watch``): the dashboard that owns its job stops it with q."""
    VIEW_ACTIONS: ClassVar[dict[str, tuple[str, ...]]] = {
        "select_rank": ("processes", "grid"),
        "stacks": ("processes",),
        **dict.fromkeys(("grid_measure", "grid_attention", "open_rank"), ("grid",)),
    }
    """The actions of some views only, and those views."""

    def __init__(
        self,
        source: Source,
        *,
        frame_hz: float = FRAME_HZ,
        headroom_alert: float = 0.10,
        quit_on_signals: bool = False,
        terminal: TerminalGuard | None = None,
        notice: str | None = None,
        can_detach: bool = False,
    ) -> None:
        super().__init__()
        if "TEXTUAL_ANIMATIONS" not in os.environ:  # a user's own choice is kept
            # The tab bar's underline slides for 0.3 s at 60 frames a second: some 20 screen updates a view
            # switch, on the thread that also takes in the job's events.
            self.animation_level = "none"
        self.quit_on_signals = quit_on_signals
        """SIGTERM quits as q does, SIGHUP loses the terminal and SIGUSR1 dumps every rank's stack (the CLI's
        app; tests leave the test runner's handlers alone)."""
        self.terminal = terminal
        """The guard of the terminal (the CLI's): once it is lost, the app exits and leaves the job running."""
        self.source = source
        self.notice = notice
        """Said once the dashboard is up (what a viewer opened, say)."""
        self.can_detach = can_detach
        """d leaves the dashboard and lets the job go on (a recorded ``run``'s, :mod:`meshtop.tui.detach`)."""
        self.detached = False
        self.frame_hz = frame_hz
        self.headroom_alert = headroom_alert
        self.state = self._new_state()
        self.rank_filter_text = ""
        self._rank_filter: Callable[[RankView], bool] = every_rank
        self.frame_times_s: deque[float] = deque(maxlen=256)
        self.messages: deque[str] = deque(maxlen=32)
        """What the app told the user in notifications, newest last."""
        self.quitting = False
        self._hang_asked: HangDetected | None = None
        self.gc_pacer = GcPacer(
            every_frames=max(1, round(frame_hz * GC_EVERY_S)), reclaim_every=round(WHOLE_GC_EVERY_S / GC_EVERY_S)
        )

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Textual's run, its terminal guarded where the CLI gave a guard (:mod:`meshtop.tui.terminal`)."""
        if self.terminal is None:
            return super().run(*args, **kwargs)
        self.terminal.install()
        try:
            return super().run(*args, **kwargs)
        finally:
            self.terminal.uninstall()

    def on_unmount(self) -> None:
        self.gc_pacer.stop()

    def notify(self, message: str, **options: object) -> None:
        self.messages.append(message)
        super().notify(message, **options)  # type: ignore[arg-type]

    def _new_state(self) -> DashboardState:
        live = self.source.playback is None  # a replay's figures are always those of its position
        return DashboardState(
            self.source.description,
            recording=self.source.recording,
            headroom_alert=self.headroom_alert,
            figures_every_s=LIVE_FIGURES_EVERY_S if live else 0.0,
            session=self.source.session,
        )

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        with TabbedContent(initial="overview"):
            for number, (view, label, panel) in enumerate(VIEWS, 1):
                with TabPane(f"{number} {label}", id=view), VerticalScroll():
                    yield panel(id=f"{view}-panel")
        yield ReplayBar(id="replay")
        yield Footer()

    def on_mount(self) -> None:
        self.gc_pacer.start()
        loop = asyncio.get_running_loop()
        if self.quit_on_signals:
            loop.add_signal_handler(signal.SIGTERM, self.stop_now)
            loop.add_signal_handler(signal.SIGUSR1, lambda: self.source.ask_stacks(None))  # as in `record`
        if self.terminal is not None:
            terminal = self.terminal
            terminal.on_lost = lambda: loop.call_soon_threadsafe(self._terminal_lost)
            if self.quit_on_signals:
                loop.add_signal_handler(signal.SIGHUP, lambda: terminal.lose("SIGHUP"))
            if terminal.lost:  # before the app could hear of it
                self._terminal_lost()
        elif self.quit_on_signals:
            loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.action_quit()))
        self.source.start()
        self.frame()
        self.set_interval(1 / self.frame_hz, self.frame)
        if self.notice:
            self.notify(self.notice, timeout=8)

    # -- the frame ---------------------------------------------------------------

    def frame(self) -> None:
        """Fold in what the source has, then redraw the header and the visible view."""
        started = time.perf_counter()
        self.state = self.source.poll(self.state)
        self.state.set_clock(self.source.now_ns(), self.source.started_ns())
        if not self.state.steps_done and not self.state.ranks_started():  # the launcher's phase: read until a
            self.state.launcher_phase = self.source.launcher_phase()  # rank reports (then the ranks say)
        self.redraw()
        self.frame_times_s.append(time.perf_counter() - started)
        if self.gc_pacer.frame_drawn():  # once the frame is on screen: the time it took, its rendering included
            self.call_after_refresh(lambda: self.gc_pacer.collect(time.perf_counter() - started))
        self._ask_about_hang()
        if self.source.error is not None and not self.quitting:
            self.quitting = True  # the session broke (say, the disk is full): the CLI reports why, in one line
            self.exit()

    def _ask_about_hang(self) -> None:
        """On a live job, a newly reported hang opens the report with the choice to stop or wait."""
        hang = self.state.notices.hang
        if hang is None or hang is self._hang_asked or self.source.playback is not None or self.source.finished:
            return
        self._hang_asked = hang
        if isinstance(self.screen, HangScreen):  # still open on an earlier report of the same hang
            return

        def decide(stop: bool | None) -> None:
            if stop and (refusal := self.source.ask_stop()):
                self.notify(refusal, severity="error")
            elif stop:
                self.notify("stopping every rank; the recording is kept with the hang report")

        self.push_screen(HangScreen(hang), decide)

    def redraw(self) -> None:
        """Draw the dashboard (also under a prompt or a report, which sit on their own screens)."""
        dashboard = self.screen_stack[0] if self.screen_stack else None
        if dashboard is None or not dashboard.is_attached or not self._widgets.header.is_attached:  # closing
            return
        extra = f"ranks {self.rank_filter_text}" if self.rank_filter_text else ""
        self._widgets.header.show(self.state, self.source.status, extra)
        self._widgets.replay_bar.show(self.source)
        self.active_panel().show(self.state, self._rank_filter)

    @cached_property
    def _widgets(self) -> DashboardWidgets:
        """The dashboard's widgets, looked up once: a query walks the screen's widgets each time, and a
        frame uses three."""
        dashboard = self.screen_stack[0]
        return DashboardWidgets(
            dashboard.query_one(HeaderBar),
            dashboard.query_one(ReplayBar),
            dashboard.query_one(TabbedContent),
            {view: dashboard.query_one(f"#{view}-panel", Panel) for view, _, _ in VIEWS},
        )

    def active_panel(self) -> Panel:
        return self._widgets.panels[self._widgets.tabs.active or "overview"]

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.call_after_refresh(self.redraw)

    # -- actions -------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "interrupt":
            return True
        if isinstance(self.screen, ModalScreen):  # a prompt or the help: its keys are its own
            return False
        if action in self.REPLAY_ACTIONS:
            return self.source.playback is not None
        if action in self.VIEWER_ACTIONS:
            return self.source.playback is None and not self.source.owns_job
        if action == "detach":
            return self.can_detach and not self.source.finished and not self.quitting
        if action in self.VIEW_ACTIONS:
            return self.query_one(TabbedContent).active in self.VIEW_ACTIONS[action]
        return True

    async def action_interrupt(self) -> None:
        await self.action_quit()

    def action_view(self, view: str) -> None:
        tabs = self._widgets.tabs
        if tabs.active != view:
            shown, panel = self.active_panel(), self._widgets.panels[view]
            # Drawn before it is shown, at the width of the view it replaces (the same place on the screen):
            # the switch lays out and renders the view's rows once, where a panel painted after would draw
            # them all again a frame later (a whole pane's worth of rows).
            panel.hidden_width = shown.size.width
            panel.show(self.state, self._rank_filter)
        tabs.active = view

    def action_cycle_view(self, delta: int) -> None:
        names = [view for view, _, _ in VIEWS]
        current = names.index(self.query_one(TabbedContent).active or "overview")
        self.action_view(names[(current + delta) % len(names)])

    def action_help(self) -> None:
        """Every key that does something here: a live job's help leaves out the replay's keys."""
        replay = self.source.playback is not None
        bindings = [b for b in self.BINDINGS if isinstance(b, Binding)]
        shown = [b for b in bindings if replay or b.action.split("(")[0] not in self.REPLAY_ACTIONS]
        self.push_screen(HelpScreen(shown, replay=replay))

    def action_filter(self) -> None:
        def apply(text: str | None) -> None:
            if text is None:
                return
            try:
                self._rank_filter = parse_rank_filter(text)
            except MeshtopError as error:
                self.notify(str(error), severity="error")
                return
            self.rank_filter_text = text.strip()
            self.redraw()

        self.push_screen(
            PromptScreen("Show ranks (0-3,7 · pp=1 · dp=0 tp=1 · empty for all):", self.rank_filter_text), apply
        )

    def action_select_rank(self, delta: int) -> None:
        if self.query_one(TabbedContent).active == "grid":
            self.query_one(GridPanel).move(delta)
        else:
            self.query_one(ProcessesPanel).move(self.state, self._rank_filter, delta)
        self.redraw()

    def action_open_rank(self) -> None:
        """The rank chosen in the Grid view, in the Procs view (its process, and its stack with s)."""
        chosen = self.query_one(GridPanel).chosen
        if chosen is not None:
            self.query_one(ProcessesPanel).selected = chosen
            self.action_view("processes")

    def action_grid_measure(self) -> None:
        self.query_one(GridPanel).cycle_measure()
        self.redraw()

    def action_grid_attention(self) -> None:
        panel = self.query_one(GridPanel)
        panel.only_attention = not panel.only_attention
        self.redraw()

    def action_stacks(self, every: bool) -> None:
        selected = self.query_one(ProcessesPanel).selected
        ranks = None if every or selected is None else [selected]
        refusal = self.source.ask_stacks(ranks)
        if refusal:
            self.notify(refusal, severity="warning")
        else:
            who = "every rank" if ranks is None else f"rank {selected}"
            self.notify(f"py-spy is dumping {who}; the stack appears below the table")

    def action_detach(self) -> None:
        """d: leave the dashboard, the job going on headless (the CLI gives the shell back)."""
        self.detached = self.quitting = True
        self.exit()

    def action_stop_job(self) -> None:
        """k, in a viewer: stop the job through its writer, once confirmed."""

        def go(answer: str | None) -> None:
            if (answer or "").strip().lower() not in ("y", "yes"):
                return
            refusal = self.source.ask_stop()
            if refusal:
                self.notify(refusal, severity="error")
            else:
                self.notify("stopping every rank; the writer closes the recording", timeout=30)

        self.push_screen(PromptScreen("Stop the job for everyone? Type y and Enter (Escape: no):"), go)

    def action_playback(self, control: str) -> None:
        """A replay control (a :class:`Playback` method without arguments), shown at once."""
        if (playback := self.source.playback) is not None:
            getattr(playback, control)()
            self.frame()

    def action_seek(self) -> None:
        playback = self.source.playback
        if playback is None:
            return

        def go(target: str | None) -> None:
            if not target:
                return
            try:
                seek(playback, target)
            except MeshtopError as error:
                self.notify(str(error), severity="error")
                return
            self.frame()

        self.push_screen(PromptScreen("Seek to a step (e.g. 12) or a time (30s, 1:20):"), go)

    async def action_quit(self) -> None:
        """q: a live run until stopped ends after its next steps and completes; any other job is stopped."""
        self._quit(finish=True)

    def stop_now(self) -> None:
        """SIGTERM: stop the job at once, even after a q whose run is still ending."""
        self._quit(finish=False)

    def _quit(self, *, finish: bool) -> None:
        source = self.source
        if self.quitting:
            if not finish and source.owns_job and not source.finished:
                source.stop()
            return
        self.quitting = True
        if not source.owns_job or source.finished:  # a replay, or a viewer: the job is not the dashboard's
            source.stop()
            self.exit()
            return
        if finish and self.state.info.until_stopped:
            source.finish()
            self.notify("ending the run after its next steps, then closing the recording…", timeout=30)
        else:
            source.stop()
            self.notify("stopping every rank and closing the recording…", timeout=30)
        self.run_worker(self._exit_when_stopped, thread=True, name="stop-job")

    def _terminal_lost(self) -> None:
        """The terminal went away: leave the screen (the guard put a silent terminal in its place) and the job
        to the CLI, which goes on headless; a quit already asked for goes on."""
        if not self.quitting:
            self.quitting = True
            self.exit()

    def _exit_when_stopped(self) -> None:
        self.source.wait()
        self.call_from_thread(self.exit)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for view, label, panel in VIEWS:
            yield SystemCommand(f"View: {label}", panel.__doc__ or "", lambda view=view: self.action_view(view))
        yield SystemCommand("Filter ranks", "show only some ranks", self.action_filter)
        yield SystemCommand("Stack dump: every rank", "py-spy dump of every rank", lambda: self.action_stacks(True))
        if self.source.playback is not None:
            yield SystemCommand(
                "Replay: pause / resume", "pause or resume the replay", lambda: self.action_playback("toggle_pause")
            )
            yield SystemCommand("Replay: seek", "go to a step or a time", self.action_seek)


def seek(playback: Playback, target: str) -> None:
    """Move a replay to ``12`` (step 12, 1-based), ``30s`` / ``30.5`` seconds, or ``1:20``."""
    text = target.strip().lower()
    try:
        if ":" in text:
            minutes, seconds = text.split(":", 1)
            playback.seek_time(int(minutes) * 60 + float(seconds))
        elif text.endswith("s"):
            playback.seek_time(float(text[:-1]))
        elif text.isdigit():
            if int(text) < 1:
                raise MeshtopError("steps count from 1")
            playback.seek_step(int(text) - 1)
        else:
            playback.seek_time(float(text))
    except ValueError:
        raise MeshtopError(f"{target!r} is neither a step (12) nor a time (30s, 1:20)") from None
    playback.paused = True
