"""Pipelines: datasets made in several steps (generate, judge, filter, map, dedupe) that
stream, resume and cost only what changed."""
