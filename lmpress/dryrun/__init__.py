"""What a job will cost before it runs: every row's prompt counted as its engine will count it
(`prompt_tokens`, through the engine's own `prompt_counter`), priced (`pricing`), and tallied
(`tally`) by `lmpress batch --dry-run` (`run`). The budget guardrails and the job summary price
rows with the same `pricing`."""
