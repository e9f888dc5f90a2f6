"""Protocols over shares: plain functions of a session and share pointers."""
