"""The planner: every plan of N ranks predicted from the model's shape (``plans``), held against the
devices (``report``), and run as a sweep of recordings (``sweep``); a server's capacity searched over rates and
configurations of its command (``capacity``). The predictions import no torch."""
