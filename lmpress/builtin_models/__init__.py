"""The models lmpress can name without a download: the real SmolLM2 that ships inside a package
(`packaged`), and tiny random-weight models built offline for tests, the demo and benchmarks
(`tiny` for transformers directories, `tiny_gguf` for GGUF files). Engines resolve these names
through `engines/common/models.py`; nothing here imports an engine."""
