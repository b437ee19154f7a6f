"""Measure: hooks inside workers, samplers on each node, and the event stream."""
