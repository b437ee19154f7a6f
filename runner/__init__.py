"""Launch and parallelise the job: plans, the built-in model, the worker and its supervisor."""
