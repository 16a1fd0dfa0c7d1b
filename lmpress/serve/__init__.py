"""`lmpress serve`: an OpenAI-compatible HTTP API over any engine.

`protocol` holds the OpenAI wire shapes, `app` the FastAPI app, `server` the process that loads
the engine and runs uvicorn. Nothing is imported here, so that `lmpress --help` stays light.
"""
