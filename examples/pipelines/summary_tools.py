"""The summaries example's map function: plain Python over one row, named in the pipeline as
`summary_tools:measure`. lmpress imports it from the directory the command runs in, which is
why the examples run from examples/pipelines/."""


def measure(row: dict) -> dict:
    """The summary's length in words, and how much shorter it is than the document: a later
    filter or a reader can spot a "summary" that merely copies its document."""
    words = len(row["summary"].split())
    compression = round(words / len(row["text"].split()), 2)
    return {**row, "summary_words": words, "compression": compression}
