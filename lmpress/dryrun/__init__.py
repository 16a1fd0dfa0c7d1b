"""What a job will cost before it runs: every row's prompt counted as its engine will count it
(`prompt_tokens`, through the engine's own `prompt_counter`), priced (`batch.pricing`), and
tallied (`tally`) by `lmpress batch --dry-run` (`run`). The price list lives with the batch
runner, whose budget guardrails and job summary price rows with it, so that the dry run reads
the runner and the runner never reads the dry run."""
