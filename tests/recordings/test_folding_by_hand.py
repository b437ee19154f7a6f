"""The fold thread's bound, worked by hand: a backlog of exactly the bound leaves nothing out, a block past it is
left out with every event it stands for, the batch folded after it says which kinds it lacks, and the thread
never holds the interpreter at its exit."""

from __future__ import annotations

import threading
from pathlib import Path

from meshtop.probes.arrivals import Arrivals, EncodedEvents, encode_lines
from meshtop.recordings.folding import FoldThread
from meshtop.recordings.session_fold import Folded
from tests.kit.events import collective, step
from tests.recordings.test_folding import hand_over, recorder_in


def test_a_backlog_of_exactly_the_bound_leaves_nothing_out(tmp_path: Path) -> None:
    """Bound 2, and one batch of 2 all-reduces (ranks 0 and 1 of step 0): 2 events wait, not more than 2, so
    both are folded."""
    recorder = recorder_in(tmp_path)
    folding = FoldThread(recorder, lambda arrivals, folded: None, backlog=2)
    hand_over(recorder, folding, [[collective(0, 0), collective(1, 0)]])
    folding.close()
    assert not recorder.session.left_out
    [row] = recorder.session.figures().collectives
    assert row.count == 2


def test_a_block_past_the_bound_is_left_out_with_every_event_it_holds_and_its_batch_says_so(tmp_path: Path) -> None:
    """Bound 2, and a node's block of rank 0's 3 all-reduces: 3 events wait, past the bound, so the block is left
    out: 3 events counted, not 1 (a block stands for its count). The batch folded after it lacks the bulk kinds
    and says so (a live screen draws what was left out); the next batch, within the bound, lacks nothing, and
    its step completes."""
    recorder = recorder_in(tmp_path)
    said: list[frozenset[str]] = []
    folded_once = threading.Event()

    def keep_what_each_lacks(arrivals: Arrivals, folded: Folded) -> None:
        said.append(folded.left_out)
        folded_once.set()

    folding = FoldThread(recorder, keep_what_each_lacks, backlog=2)
    block = EncodedEvents("collective", 0, encode_lines([collective(0, number) for number in range(3)]), 3)
    hand_over(recorder, folding, [[block]])
    assert folded_once.wait(30)
    hand_over(recorder, folding, [[step(0, 0), step(1, 0)]])
    folding.close()
    assert recorder.session.left_out == {"collective": 3}
    assert said == [frozenset({"collective", "stage_action"}), frozenset()]
    assert recorder.session.steps_completed == 1


def test_the_folds_thread_is_a_daemon_named_meshtop_fold(tmp_path: Path) -> None:
    """A session that fails before it closes its fold must not hold the interpreter at exit (a thread that is
    not a daemon is joined there, and this one waits for batches forever); a dump of the head's threads (py-spy,
    faulthandler) names it."""
    recorder = recorder_in(tmp_path)
    before = set(threading.enumerate())
    folding = FoldThread(recorder, lambda arrivals, folded: None)
    started = [thread for thread in threading.enumerate() if thread not in before]
    folding.close()
    assert [(thread.name, thread.daemon) for thread in started] == [("meshtop-fold", True)]
