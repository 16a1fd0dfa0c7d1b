"""The `lmpress` command line."""
