"""Implementations of the live contract: Gemini, local models, and the transport double."""
