"""Pipelines: named steps (generate, judge, filter, map, dedupe) over rows of columns."""
