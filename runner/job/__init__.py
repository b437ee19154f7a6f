"""Launch and supervise a job: the launcher child (torchrun), exits and hangs, torchrun's restarts, and the
session that records it with ``record``'s console."""
