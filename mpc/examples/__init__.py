"""Plaintext example data and models, and the demo that `make demo` runs."""
