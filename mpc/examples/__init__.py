"""Plaintext example data and models used by the encrypted-inference demos."""
