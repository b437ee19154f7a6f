"""What the tests share, in one place.

- :mod:`tests.kit.events`: events made by hand (a rank's start, a step, a collective), as the probes send them.
- :mod:`tests.kit.recordings`: run descriptions (a built-in plan, a user's elastic torchrun script) and
  recordings made by hand, the way meshtop writes them, and waiting for a recording being written to reach a
  step.
- :mod:`tests.kit.inference`: a hand-built inference recording whose request figures are worked out by hand.
- :mod:`tests.kit.commands`: meshtop's command line: its argv under this Python, run to its end, its one-line
  errors, its summary as JSON.
- :mod:`tests.kit.jobs`: a real multi-rank job on CPU, launched and collected; how close its losses are to one
  process's (``RTOL``).
- :mod:`tests.kit.reference`: what meshtop's results are checked against, computed the plain way (greedy
  generation without a KV cache).
- :mod:`tests.kit.screen`: the text a running Textual app shows, read through its public screenshot export.
"""
