"""Launch and supervise a job: the launcher child (torchrun), its samplers, exits and hangs, and torchrun's
restarts."""
