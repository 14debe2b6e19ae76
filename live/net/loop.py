"""The event loop a server process runs on: uvloop where it is installed, else asyncio's own.

A relay's time goes mostly to the event loop: a wake-up, a socket read and a
TLS record per audio frame, each way. uvloop runs the same asyncio programs on
libuv, with its transports and TLS in compiled code, so every session costs
less CPU (see the README's Performance section). Nothing else changes: anyio,
websockets and google-genai run on it unmodified. `--loop asyncio` keeps the
standard loop, e.g. to rule the loop out when chasing a problem.
"""

from __future__ import annotations

import gc
import importlib.util
from typing import Any

__all__ = ["CHOICES", "LoopUnavailable", "backend_options", "resolve", "tune_gc_for_serving"]

CHOICES = ("auto", "uvloop", "asyncio")


class LoopUnavailable(Exception):
    """The loop asked for cannot run here."""


def _have_uvloop() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve(choice: str) -> str:
    """The loop `choice` means here: "uvloop" or "asyncio" ("auto": uvloop when installed)."""
    if choice not in CHOICES:
        raise LoopUnavailable(f"unknown event loop {choice!r}: choose one of {', '.join(CHOICES)}")
    if choice == "auto":
        return "uvloop" if _have_uvloop() else "asyncio"
    if choice == "uvloop" and not _have_uvloop():
        raise LoopUnavailable("uvloop is not installed here (pip install uvloop; not available on Windows)")
    return choice


def backend_options(choice: str) -> dict[str, Any]:
    """`anyio.run(..., backend_options=...)` for the loop `choice` means here."""
    return {"use_uvloop": resolve(choice) == "uvloop"}


def tune_gc_for_serving(young: int = 10_000) -> None:
    """Garbage-collector settings for a process that serves sessions; call once, loaded.

    Every audio frame allocates a few short-lived objects, and with hundreds of
    sessions the objects in flight cross CPython's default young-generation
    threshold (700) dozens of times a second; each crossing collects, and every
    tenth promotes into a full collection of the whole heap, which stops every
    session at once (140 ms pauses at 200 sessions). A threshold of `young`
    net allocations is rarely crossed by objects in flight, only by garbage
    that accumulates, and freezing what was loaded before serving keeps it out
    of every full collection. Process-wide, hence for entry points, not for a
    library: `live serve` calls it.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)
