"""Pipelines: datasets made in several named steps (generate, judge, filter, map, dedupe) over
rows of columns, streamed from step to step, journaled so a rerun costs only what changed
(`lmpress run`, `pipeline/runner.py`)."""
