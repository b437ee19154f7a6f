"""The planner: every plan of N ranks predicted from the model's shape (``plans``), held against the
devices (``report``), and run as a sweep of recordings (``sweep``). The predictions import no torch."""
