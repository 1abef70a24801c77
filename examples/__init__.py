"""Runnable examples; ``make run`` starts :mod:`examples.run`."""
