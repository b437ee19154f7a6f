"""Device-timed step phases, by the rules of meshtop.probes.device_clock, on a scripted device.

CUDA events are a boundary this machine cannot reach, so their three methods are played by a device that
reaches a mark at once while idle and ``lag_ns`` after the host recorded it while busy: the rules (an anchor
on an idle stream, marks read once complete, the host's windows until then) are tested here, the real events
on a GPU (tests/probes/test_gpu.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshtop.probes.device_clock import DeviceClock
from meshtop.probes.events import StepTiming
from meshtop.probes.losses import PendingLoss
from meshtop.probes.phases import BACKWARD, DATA, FORWARD, Phases
from meshtop.runner.script.attach import WaitingStep

MS = 1_000_000


@dataclass
class Device:
    lag_ns: int
    busy: bool = False
    capturing: bool = False
    """A CUDA graph is being captured."""
    host_ns: int = 0
    """The host's wall clock now."""
    reached_ns: int = 0
    """How far the device has run its stream, on the host's clock."""

    def idle(self) -> bool:
        return not self.busy

    def event(self) -> Event:
        return Event(self)

    def at(self, host_ns: int) -> Device:
        self.host_ns = host_ns
        return self


@dataclass
class Event:
    device: Device
    at_ns: int = -1
    """When the device reaches it, on the host's clock (a device clock of its own differs by a constant, which
    the anchor cancels)."""

    def record(self) -> None:
        self.at_ns = self.device.host_ns + (self.device.lag_ns if self.device.busy else 0)

    def query(self) -> bool:
        return self.device.reached_ns >= self.at_ns

    def elapsed_time(self, end_event: Event) -> float:
        assert self.query() and end_event.query(), "CUDA refuses elapsed_time of an event not reached"
        return (end_event.at_ns - self.at_ns) / 1e6


def phases_on(device: Device) -> Phases:
    clock = DeviceClock(
        event_factory=device.event,
        stream_idle=device.idle,
        host_ns=lambda: device.host_ns,
        capturing=lambda: device.capturing,
    )
    return Phases(clock, now_ns=lambda: device.host_ns)


def test_forward_and_backward_take_the_devices_times_once_their_marks_complete_and_data_the_hosts() -> None:
    device = Device(lag_ns=5 * MS)
    phases = phases_on(device)
    phases.take()  # an idle stream: the first anchor
    phases.begin(DATA)
    device.at(1 * MS).busy = True  # the batch came; from here the device runs each mark 5 ms after it is queued
    phases.end(DATA)
    phases.begin(FORWARD)
    device.at(2 * MS)
    phases.end(FORWARD)
    phases.begin(BACKWARD)
    device.at(3 * MS)
    phases.end(BACKWARD)
    windows = phases.take()
    assert not windows.ready()  # the device has not reached the marks, and nothing waits for it
    assert windows.final() == ("dfb", (0, 1 * MS, 2 * MS), (1 * MS, 2 * MS, 3 * MS))  # the host's, meanwhile
    device.reached_ns = 8 * MS
    assert windows.ready()
    assert windows.final() == ("dfb", (0, 6 * MS, 7 * MS), (1 * MS, 7 * MS, 8 * MS))  # data stays the host's


def test_without_an_anchor_the_hosts_windows_stay_and_a_stream_seen_idle_gives_one() -> None:
    device = Device(lag_ns=4 * MS, busy=True)
    phases = phases_on(device)
    phases.begin(FORWARD)
    device.at(1 * MS)
    phases.end(FORWARD)
    windows = phases.take()  # busy at the step's end: no anchor
    device.reached_ns = 5 * MS
    assert windows.ready() and windows.final() == ("f", (0,), (1 * MS,))  # complete, and placed by the host
    device.at(6 * MS)
    phases.begin(FORWARD)
    device.at(7 * MS)
    phases.end(FORWARD)
    device.busy = False  # drained by the step's end (the script read a value)
    device.reached_ns = 11 * MS
    later = phases.take()
    assert later.ready() and later.final() == ("f", (10 * MS,), (11 * MS,))


def test_a_script_step_goes_out_once_its_loss_and_its_device_windows_have_come() -> None:
    device = Device(lag_ns=3 * MS)
    phases = phases_on(device)
    phases.take()
    device.at(1 * MS).busy = True
    phases.begin(FORWARD)
    device.at(2 * MS)
    phases.end(FORWARD)
    timing = StepTiming(rank=0, step=0, start_ns=0, duration_s=0.003, tokens=0, loss=None)
    waiting = WaitingStep(timing, PendingLoss(count=2, _total=5.0), phases.take())
    assert not waiting.ready()
    given_up = waiting.finished()  # past the wait: the host's window, and the loss where it came
    assert (given_up.phase_start_ns, given_up.loss) == ((1 * MS,), 5.0)  # the sum of its 2 losses
    device.reached_ns = 5 * MS
    assert waiting.ready()
    done = waiting.finished()
    assert (done.phases, done.phase_start_ns, done.phase_end_ns, done.loss, done.losses) == (
        "f",
        (4 * MS,),
        (5 * MS,),
        5.0,
        2,
    )


def test_a_window_opened_while_a_cuda_graph_is_captured_keeps_the_hosts_times() -> None:
    device = Device(lag_ns=2 * MS)
    phases = phases_on(device)
    phases.take()
    device.capturing = device.busy = True
    phases.begin(FORWARD)  # no event goes into the graph being captured
    device.at(1 * MS).capturing = False
    phases.end(FORWARD)
    phases.begin(BACKWARD)
    device.at(2 * MS)
    phases.end(BACKWARD)
    windows = phases.take()
    device.reached_ns = 10 * MS
    assert windows.ready() and windows.final() == ("fb", (0, 3 * MS), (1 * MS, 4 * MS))
