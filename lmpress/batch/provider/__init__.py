"""Provider batch APIs from the command line: `lmpress batch --provider-batch` (or
`remote_params.batch_completion_window`) runs a job's rows through OpenAI's Batch API,
Anthropic's Message Batches or Gemini's batch mode, crash-safe and with the output a live run
writes (`job`)."""
