"""Anthropic's Messages API on the wire, both directions.

- `server`: requests in and replies out, as `lmpress serve` answers `/v1/messages`;
- `client`: requests out and replies in, as the ANTHROPIC engine and the Message Batches API
  send and read them.

Nothing is imported here, so that `lmpress --help` stays light.
"""
