"""The wire protocols lmpress speaks, one place per protocol, both directions.

- `openai/`: OpenAI's chat, completions, embeddings and Responses bodies, which serve answers,
  batch reads and writes in OpenAI Batch files, and the remote engines send and read back;
- `anthropic/`: Anthropic's Messages API, requests in (`server`, serve's /v1/messages) and out
  (`client`, the ANTHROPIC engine and its batch API);
- `gemini`: Gemini's own request and reply shapes, which its batch API speaks;
- `images`: image parts made inline (base64) for a server that cannot read local files;
- `replies`: what one successful attempt at a remote API produced, as every reply parser
  returns it, and `MalformedResponse` for a 2xx body that is not what the API promises.

Wire is below the engines and the fronts: it imports none of them, so that an engine, serve and
batch's provider APIs all read and write a protocol through the same code.
Nothing is imported here, so that `lmpress --help` stays light.
"""
