"""`lmpress serve`: an OpenAI-compatible HTTP API over any engine.

`app` holds the FastAPI app (its bodies and answers come from `lmpress.wire.openai`), `asgi` the
response that runs a generation and the middleware, `server` the process that loads the engine
and runs uvicorn. Nothing is imported here, so that `lmpress --help` stays light.
"""
