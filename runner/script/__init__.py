"""A user's own script: the command after ``--`` checked before launch (``command``), and the probes
attached to each of its ranks (``attach``, through ``bootstrap/sitecustomize.py``)."""
