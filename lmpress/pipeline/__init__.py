"""Pipelines: datasets made in several steps (generate, judge, filter, map, dedupe) that stream
rows from one step to the next."""
