"""Several Live emulators as the backends of one pool, and `live serve` in front.

Each emulator plays one backend (a key, a region) with its own bad days
(`Emulator.outage`, `go_down`, `come_back`). `emulated_backends()` starts them,
writes the pool file `live serve --backends` reads (each backend's key named by
an environment variable, never written) and one CA bundle trusting all of
them, and yields what a `live serve` process needs: `Backends.serve(...)`.
Used by the failover tests and benchmarks (`bench.backend_failover`,
`bench.backend_soak`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from connections.emulator import Emulator, Script, running_emulator
from connections.emulator.script import ReplyContext

__all__ = ["AGENT", "MODEL", "Backends", "Serve", "emulated_backends", "reply", "tool_runs"]

MODEL = "gemini-2.5-flash-native-audio-preview-12-2025"
ROOT = Path(__file__).resolve().parent.parent
TOOL_LOG_ENV = "LIVE_BENCH_TOOL_LOG"

_QUESTION = re.compile(r"q\d+x\d+")
_RESULT = re.compile(r"(\w+)\((\{.*?\})\) returned (\{.*?\})(?=\]|$|\n)", re.MULTILINE)


def reply(ctx: ReplyContext) -> str:
    """What every emulated model says: a tool's result when it has one (from
    its call, or told as the last thing on a new connection), else the
    question's number first (a reply's end may be lost with its connection)."""
    results = [(r.get("name"), r.get("response")) for r in ctx.tool_results]
    questions = _QUESTION.findall(ctx.user_text)
    if not results and not questions:
        results = [(name, _loads(payload)) for name, _, payload in _RESULT.findall(ctx.user_text)]
    if results:
        return " ".join(f"{name} returned {json.dumps(r, sort_keys=True)}." for name, r in results)
    number = questions[-1] if questions else "that"
    return f"{number}, you said: {ctx.user_text.strip().rstrip('.?!')[-200:]}."


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def script(**changes: Any) -> Script:
    """The backends' script: replies as above, check_stock called when named."""
    base: dict[str, Any] = {
        "speed": 4,
        "replies": reply,
        "tool_args": {"check_stock": {"item": "kettle"}},
        "profile_overrides": {"late_transcripts": False},
    }
    base.update(changes)
    return Script(**base)


def check_stock(item: str) -> dict[str, Any]:
    """How many of an item are in stock."""
    log = os.environ.get(TOOL_LOG_ENV)
    if log:  # every run, counted across processes: a tool must run once per call
        with open(log, "a", encoding="utf-8") as runs:
            runs.write(item + "\n")
    return {"item": item, "count": 3}


def _agent() -> Any:
    from live.agent import Agent

    return Agent(name="failover", model=MODEL, tools=[check_stock], tool_timeout=5.0)


AGENT = _agent()


def tool_runs(path: str | os.PathLike[str]) -> int:
    try:
        return len(Path(path).read_text(encoding="utf-8").splitlines())
    except FileNotFoundError:
        return 0


@dataclasses.dataclass
class Backends:
    """The emulators by backend name, and what `live serve` needs to use them."""

    emulators: dict[str, Emulator]
    keys: dict[str, str]
    env: dict[str, str]
    pool_file: Path
    tool_log: Path
    directory: Path

    def serve(self, *args: str, log_name: str = "serve") -> Serve:
        return Serve(self, args, log_name)


class Serve:
    """One `live serve --backends` process; its log in the backends' directory."""

    def __init__(self, backends: Backends, args: Sequence[str], log_name: str) -> None:
        self.log_path = backends.directory / f"{log_name}.log"
        self._log: IO[str] = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "live.cli", "serve", "--port", "0", "--backends", str(backends.pool_file),
                "--agent", "bench.emulated_backends:AGENT", "--max-sessions", "200", "--max-sessions-per-ip", "200",
                *args,
            ],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log, env=backends.env, text=True, cwd=ROOT,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = re.search(r"(https?)://127\.0\.0\.1:(\d+)/", line)
        if match is None:
            self.stop()
            raise RuntimeError(f"live serve did not start: {line!r}; its log: {self.log_path.read_text()[-2000:]}")
        self.scheme, self.port = match.group(1), int(match.group(2))

    @property
    def url(self) -> str:
        return f"{'wss' if self.scheme == 'https' else 'ws'}://127.0.0.1:{self.port}/live"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()


@contextlib.asynccontextmanager
async def emulated_backends(
    names: Sequence[str] = ("a", "b"),
    *,
    script_for: Mapping[str, Script] | None = None,
    models: Mapping[str, Sequence[str]] | None = None,
    failover: Mapping[str, Any] | None = None,
) -> AsyncIterator[Backends]:
    """An emulator per backend name (`script_for` it, else `script()`), the pool
    in that order (each backend serving `models` of it, else MODEL), the
    `[failover]` table `failover` says."""
    with tempfile.TemporaryDirectory(prefix="live-backends-") as tmp:
        directory = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            emulators = {}
            for name in names:
                chosen = (script_for or {}).get(name) or script()
                emulators[name] = await stack.enter_async_context(running_emulator(chosen))
            keys = {name: f"key-of-{name}" for name in names}
            bundle = directory / "ca-bundle.pem"
            bundle.write_text("".join(Path(e.ca_file).read_text() for e in emulators.values()))
            lines = []
            if failover:
                lines.append("[failover]")
                lines += [f"{k} = {json.dumps(v)}" for k, v in failover.items()]
            for name, emulator in emulators.items():
                served = list((models or {}).get(name) or [MODEL])
                lines += [
                    "", "[[backend]]", f'name = "{name}"', f'api_key_env = "LIVE_TEST_KEY_{name.upper()}"',
                    f'base_url = "{emulator.base_url}"', 'api_version = "v1beta"', f"models = {json.dumps(served)}",
                ]
            pool_file = directory / "backends.toml"
            pool_file.write_text("\n".join(lines) + "\n")
            env = dict(os.environ)
            for variable in ("GOOGLE_API_KEY", "GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL"):
                env.pop(variable, None)
            no_proxy = env.get("NO_PROXY")
            env.update(
                SSL_CERT_FILE=str(bundle),
                NO_PROXY="127.0.0.1,localhost" + (f",{no_proxy}" if no_proxy else ""),
                **{f"LIVE_TEST_KEY_{name.upper()}": key for name, key in keys.items()},
                **{TOOL_LOG_ENV: str(directory / "tool-runs.log")},
            )
            yield Backends(emulators, keys, env, pool_file, directory / "tool-runs.log", directory)
