"""OpenAI's Responses API (`POST /v1/responses`) on the wire, split as `wire.openai` splits chat:
`requests`, the way in (a body -> the messages, tools and GenerationParams overrides of an
engine Request, checked), and `responses`, the way out (a Result -> a `response` object, or the
stream of events that builds one, from the `openai` package's own types,
`openai.types.responses`, so that its `responses.create` and `responses.stream` parse them).

lmpress keeps no responses, so the API is stateless here: `previous_response_id`,
`conversation` and `background` are refused in one line (send the whole conversation as
`input`), and a body's `store` (the API's default is true) is accepted and answered with
`store: false`, which says that nothing was kept. A reasoning model's thinking is a `reasoning`
output item whose `content` holds the thinking as `reasoning_text`, as vLLM serves it; lmpress
writes no summaries of it, so `summary` is empty.

Nothing is imported here, so that `lmpress --help` stays light.
"""
