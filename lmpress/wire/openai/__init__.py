"""The OpenAI wire protocol, in one place for every front that speaks it.

`lmpress serve` answers it, `lmpress batch` reads and writes it in OpenAI Batch files, and the
remote engines send it to OpenAI-compatible servers; all three use these modules, so that a
body one accepts the others accept, and a body one writes the others write, the way vLLM's
run-batch reuses its server's code.

- `requests`: request bodies (strict pydantic models) -> GenerationParams overrides and prompts;
- `responses`: Results -> chat.completion / text_completion bodies and stream chunks, built
  from the `openai` package's own types;
- `errors`: errors in OpenAI's shape, and the HTTP status of every error kind;
- `client`: the other direction, a Request -> the body a remote engine sends;
- `replies`: and what comes back, a JSON reply or a stream's chunks -> a Reply.

Nothing is imported here, so that `lmpress --help` stays light.
"""
