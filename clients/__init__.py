"""Clients of the live session server: the Python library, the microphone client, the browser module."""
