"""File formats (rows <-> requests and results) and streaming JSONL."""
