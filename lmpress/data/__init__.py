"""Rows in and out: row shapes (rows <-> requests and results), file formats (JSONL, Parquet,
CSV/TSV, datasets), resume, and where a job may write."""
