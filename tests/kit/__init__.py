"""What the tests share, in one place.

- :mod:`tests.kit.events`: events made by hand (a rank's start, a step, a collective), as the probes send them.
- :mod:`tests.kit.recordings`: run descriptions and recordings made by hand, the way meshtop writes them, and
  waiting for a recording being written to reach a step.
- :mod:`tests.kit.screen`: the text a running Textual app shows, read through its public screenshot export.
"""
