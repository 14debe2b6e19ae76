"""Benchmarks of the session server; `python -m bench.relay --help` for the relay benchmark."""
