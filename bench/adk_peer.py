"""ADK's `/run_live` as the benchmark's reference peer, kept in its own virtual environment.

    python -m bench.adk_peer --install     # bench/.adk-venv with google-adk (pinned), once
    python -m bench.adk_peer --status      # "installed: google-adk X" or "not installed: <why>"
    python -m bench.adk_peer --selftest    # emulator + ADK server + 2 sessions, a few seconds

The issue's comparison is "ours beside ADK in the same run", so ADK has to run
on this machine, but it must never enter the project's own environment (it pins
its own google-genai, FastAPI and pydantic). It lives in `bench/.adk-venv`
(gitignored), created on demand; everything here that runs in the project's
environment speaks to it only over HTTP and WebSocket, as a user's client would.

Three parts, each usable alone by the benchmark:

- `status()` / `install()`: is the peer there, and put it there.
- The server: `adk api_server` as a user runs it (uvicorn, no reload,
  in-memory sessions) serving one agent on a Live model with no tools,
  pointed at a Live endpoint (the emulator) through the environment the
  google-genai SDK inside ADK reads: GOOGLE_API_KEY, GOOGLE_GEMINI_BASE_URL
  (honoured by its `BaseApiClient` via `_base_url.get_base_url`) and
  SSL_CERT_FILE. `peer()` describes it for `bench.real` (the `--real` mode of
  `bench.relay` runs it beside ours); `AdkServer.start(...)` runs it here.
- The client: `AdkLiveSession.connect(url)` is one user over ADK's own
  protocol (create the session over REST, then `/run_live`): `send_audio(pcm)`
  sends a `LiveRequest` blob, `events()` yields ADK's events normalised to
  `("audio", pcm)`, `("interrupted",)`, `("turn_complete",)` and
  `("error", code, message)`. Audio bytes pass unchanged both ways (ADK keeps
  one event per model chunk), so the bench's stamped frames (bench.stats) time
  every frame through ADK as through ours. `connect(url)` wraps it in the
  client-protocol shape `bench.generator` drives (`bench.adk_peer:connect`).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "bench" / ".adk-venv"
ADK_VERSION = "2.13.0"
"""The google-adk release the peer is pinned to (the one docs/performance.md measures)."""
APP = "relay_peer"
MODEL = "gemini-live-2.5-flash-preview"
INPUT_MIME = "audio/pcm;rate=16000"

AGENT_SOURCE = f'''"""The reference peer: one Live agent, no tools, nothing between audio and the model."""

from google.adk.agents import Agent

root_agent = Agent(
    name="{APP}",
    model="{MODEL}",
    instruction="You are a helpful voice assistant. Answer briefly.",
)
'''

Event = tuple[Any, ...]


# ---------------------------------------------------------------------------- install


def _venv(venv: Path | None) -> Path:
    """`venv`, or the module's `VENV` as it is now (tests point it elsewhere)."""
    return VENV if venv is None else venv


def _venv_python(venv: Path | None = None) -> Path:
    return _venv(venv) / "bin" / "python"


def status(venv: Path | None = None) -> str:
    """`installed: google-adk X` when the peer can run, else `not installed: <why>`."""
    venv = _venv(venv)
    python = _venv_python(venv)
    if not python.exists():
        return f"not installed: no virtual environment at {venv} (python -m bench.adk_peer --install)"
    try:
        probe = subprocess.run(
            [str(python), "-c", "import google.adk, google.genai; print(google.adk.__version__)"],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"not installed: {python} does not run: {exc}"
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["import failed"])[-1]
        return f"not installed: google-adk does not import in {venv}: {last}"
    version = probe.stdout.strip()
    if version != ADK_VERSION:
        return f"not installed: {venv} has google-adk {version}, the peer is pinned to {ADK_VERSION}"
    return f"installed: google-adk {version}"


def installed(venv: Path | None = None) -> bool:
    return status(venv).startswith("installed")


def install(venv: Path | None = None, log: Any = sys.stderr) -> str:
    """Create `venv` and install the pinned google-adk into it; returns `status()`.

    Never touches the project's environment. A failure (no network to PyPI, no
    wheel for this Python) leaves a status that says why; the benchmark then
    runs without the peer.
    """
    venv = _venv(venv)
    if installed(venv):
        return status(venv)
    if not _venv_python(venv).exists():
        made = subprocess.run(
            [sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True
        )
        if made.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            return f"not installed: python -m venv failed: {made.stderr.strip()[-300:]}"
    print(f"# installing google-adk=={ADK_VERSION} into {venv} (a minute or two)", file=log)
    pip = subprocess.run(
        [str(_venv_python(venv)), "-m", "pip", "install", "--quiet", f"google-adk=={ADK_VERSION}"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if pip.returncode != 0:
        tail = (pip.stderr.strip().splitlines() or ["pip failed"])[-1]
        return f"not installed: pip install google-adk=={ADK_VERSION} failed: {tail}"
    return status(venv)


# ---------------------------------------------------------------------------- the server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tree(pid: int) -> list[int]:
    """`pid` and every process below it (uvicorn may fork workers or a reloader)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def write_agent(agents_dir: Path) -> Path:
    """The peer agent as an ADK agents directory (one app, `APP`); returns the directory."""
    app = agents_dir / APP
    app.mkdir(parents=True, exist_ok=True)
    (app / "__init__.py").write_text("from . import agent\n")
    (app / "agent.py").write_text(AGENT_SOURCE)
    return agents_dir


def server_command(port: str, agents_dir: Path, venv: Path | None = None) -> list[str]:
    """`adk api_server` as a user runs it in production: no reload, sessions in memory."""
    venv = _venv(venv)
    return [
        str(venv / "bin" / "adk"), "api_server", "--no-reload",
        "--host", "127.0.0.1", "--port", port,
        "--session_service_uri", "memory://",
        "--artifact_service_uri", "memory://",
        "--log_level", "warning",  # per-request access lines are not what we measure
        str(agents_dir),
    ]


def server_env(venv: Path | None = None, home: Path | None = None) -> dict[str, str]:
    """What the server needs besides the upstream's key, base URL and CA."""
    venv = _venv(venv)
    return {
        "GOOGLE_GENAI_USE_VERTEXAI": "false",
        "PYTHONPATH": "",  # nothing of this project inside ADK's interpreter
        # ADK's CLI keeps state in ~/.adk: not in the user's home.
        "HOME": str(home or venv / "home"),
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def peer(venv: Path | None = None) -> Any:
    """The reference peer for `bench.real` (a `Peer`), or why it cannot run here (a str)."""
    venv = _venv(venv)
    why = status(venv)
    if not why.startswith("installed"):
        return why
    from bench.real import Peer

    (venv / "home").mkdir(exist_ok=True)
    return Peer(
        name="adk",
        command=server_command("{port}", write_agent(venv / "agents"), venv),
        url="http://127.0.0.1:{port}",
        client_protocol="bench.adk_peer:connect",
        env=server_env(venv),
        cwd=str(venv),
        start_timeout=120.0,
    )


@dataclass
class AdkServer:
    """A running `adk api_server` serving the peer agent; `stop()` ends it."""

    url: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _tmp: tempfile.TemporaryDirectory[str] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu_seconds(self) -> float:
        """CPU (user + system) the server and its children used so far."""
        return sum(_cpu_s(p) for p in _tree(self.pid))

    def rss_bytes(self) -> int:
        return sum(_rss_bytes(p) for p in _tree(self.pid))

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    @classmethod
    def start(
        cls,
        *,
        base_url: str,
        api_key: str,
        ca_file: str | None,
        port: int = 0,
        venv: Path | None = None,
        timeout: float = 90.0,
    ) -> AdkServer:
        """Start the server against the Live endpoint at `base_url`; waits until it answers.

        Raises RuntimeError with the server's last log lines when it does not come up.
        """
        venv = _venv(venv)
        if not (venv / "bin" / "adk").exists():
            raise RuntimeError(status(venv))
        tmp = tempfile.TemporaryDirectory(prefix="adk-peer-")
        agents = write_agent(Path(tmp.name) / "agents")
        port = port or _free_port()
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GOOGLE_", "GEMINI_", "VIRTUAL_ENV", "PYTHON"))
        }
        env.update(server_env(venv, home=Path(tmp.name)))
        env.update(GOOGLE_API_KEY=api_key, GOOGLE_GEMINI_BASE_URL=base_url)
        if ca_file:
            env["SSL_CERT_FILE"] = ca_file
        log_path = Path(tmp.name) / "adk-server.log"
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(
                server_command(str(port), agents, venv),
                cwd=tmp.name,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        server = cls(f"http://127.0.0.1:{port}", popen, log_path, tmp)
        deadline = time.monotonic() + timeout
        while True:
            if popen.poll() is not None:
                tail = server.log_tail()
                server.stop()
                raise RuntimeError(f"adk api_server exited ({popen.returncode}):\n{tail}")
            try:
                with urllib.request.urlopen(f"{server.url}/list-apps", timeout=2) as r:
                    if APP in json.loads(r.read()):
                        return server
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                tail = server.log_tail()
                server.stop()
                raise RuntimeError(f"adk api_server did not answer in {timeout:g} s:\n{tail}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._tmp.cleanup()


@contextlib.contextmanager
def adk_server(**kwargs: Any) -> Iterator[AdkServer]:
    """`AdkServer.start(**kwargs)`, stopped on exit."""
    server = AdkServer.start(**kwargs)
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------------------- the protocol (sans I/O)


def encode_audio(pcm: bytes, mime_type: str = INPUT_MIME) -> str:
    """ADK's `LiveRequest` carrying one realtime audio blob (bytes as standard base64)."""
    data = binascii.b2a_base64(pcm, newline=False).decode("ascii")
    return '{"blob":{"mime_type":"' + mime_type + '","data":"' + data + '"}}'


def _b64(text: str) -> bytes:
    """Either alphabet: `/run_live` sends pydantic's URL-safe base64 ("AQL7_w=="),
    other JSON paths the standard one. Missing padding is tolerated."""
    if len(text) % 4:
        text += "=" * (-len(text) % 4)
    if "-" in text or "_" in text:
        return base64.urlsafe_b64decode(text)
    return binascii.a2b_base64(text, strict_mode=True)


def _get(obj: dict[str, Any], camel: str, snake: str) -> Any:
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def parse_event(text: str | bytes) -> list[Event]:
    """What one `/run_live` event means to a listener, in order: audio, then the flags.

    `/run_live` sends `Event.model_dump(by_alias=True, exclude_none=True)`: camelCase
    keys; snake_case is read too. Text, transcripts and other parts are not events
    here. A frame that is not a JSON object is an `("error", "bad_event", ...)`.
    """
    try:
        event = json.loads(text)
    except ValueError as exc:
        return [("error", "bad_event", f"not JSON: {exc}")]
    if not isinstance(event, dict):
        return [("error", "bad_event", "not a JSON object")]
    out: list[Event] = []
    content = event.get("content")
    if isinstance(content, dict):
        for part in content.get("parts") or ():
            blob = _get(part, "inlineData", "inline_data") if isinstance(part, dict) else None
            if not isinstance(blob, dict):
                continue
            mime = _get(blob, "mimeType", "mime_type") or ""
            data = blob.get("data")
            if mime.startswith("audio/") and isinstance(data, str):
                try:
                    out.append(("audio", _b64(data)))
                except (binascii.Error, ValueError):
                    out.append(("error", "bad_event", "audio that is not base64"))
    if event.get("interrupted"):
        out.append(("interrupted",))
    if _get(event, "turnComplete", "turn_complete"):
        out.append(("turn_complete",))
    code = _get(event, "errorCode", "error_code")
    if code:
        out.append(("error", str(code), str(_get(event, "errorMessage", "error_message") or "")))
    return out


# ---------------------------------------------------------------------------- one session


def _post_json(url: str) -> Any:
    request = urllib.request.Request(
        url, data=b"{}", headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


class AdkLiveSession:
    """One user's `/run_live` session: mic audio up, normalised events down."""

    def __init__(self, ws: Any, session_id: str) -> None:
        self._ws = ws
        self.session_id = session_id
        self.close_code: int | None = None
        self.close_reason = ""
        self._closing = False

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls, url: str, user_id: str = "bench-user", *, app: str = APP, open_timeout: float = 30
    ) -> AsyncIterator[AdkLiveSession]:
        """Create a session over ADK's REST API, then open `/run_live` for it (AUDIO)."""
        import anyio
        from websockets.asyncio.client import connect as ws_connect

        base = url.rstrip("/")
        created = await anyio.to_thread.run_sync(
            _post_json, f"{base}/apps/{app}/users/{user_id}/sessions"
        )
        session_id = created["id"]
        ws_url = (
            base.replace("http", "ws", 1)
            + f"/run_live?app_name={app}&user_id={user_id}&session_id={session_id}"
            "&modalities=AUDIO"
        )
        async with ws_connect(ws_url, open_timeout=open_timeout, max_size=None) as ws:
            session = cls(ws, session_id)
            try:
                yield session
            finally:
                await session.close()

    async def send_audio(self, pcm: bytes) -> None:
        """One microphone frame (PCM16 LE mono, 16 kHz) as a realtime blob."""
        await self._ws.send(encode_audio(pcm))

    async def events(self) -> AsyncIterator[Event]:
        """Normalised events until the socket closes (close code kept in `close_code`)."""
        from websockets.exceptions import ConnectionClosed

        try:
            async for frame in self._ws:
                for event in parse_event(frame):
                    yield event
        except ConnectionClosed:
            pass
        self.close_code = self._ws.close_code
        self.close_reason = self._ws.close_reason or ""
        if self.close_code not in (None, 1000) and not self._closing:
            yield ("error", f"closed_{self.close_code}", self.close_reason)

    async def close(self) -> None:
        self._closing = True
        await self._ws.close()


class GeneratorClient:
    """An `AdkLiveSession` in the shape `bench.generator` drives a `LiveClient`."""

    def __init__(self, session: AdkLiveSession) -> None:
        self.session = session

    async def send_audio(self, pcm: bytes) -> None:
        await self.session.send_audio(pcm)

    async def events(self) -> AsyncIterator[Any]:
        from clients.client import AudioFrame
        from live.protocol import ErrorEvent, TurnComplete, TurnInterrupted

        interrupted, complete = TurnInterrupted(), TurnComplete()
        async for event in self.session.events():
            kind = event[0]
            if kind == "audio":
                yield AudioFrame(event[1])
            elif kind == "interrupted":
                yield interrupted
            elif kind == "turn_complete":
                yield complete
            else:
                yield ErrorEvent(code=event[1], message=event[2], fatal=event[1].startswith("closed_"))

    async def close(self) -> None:
        await self.session.close()


_users = itertools.count(1)


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[GeneratorClient]:
    """The client protocol `bench.adk_peer:connect` (see `bench.client_protocols`):
    one new ADK session per call, as a `GeneratorClient`."""
    async with AdkLiveSession.connect(url, f"bench-user-{next(_users)}") as session:
        yield GeneratorClient(session)


# ---------------------------------------------------------------------------- selftest


SPEAK_S = 1.2
CYCLE_S = 4.0
FRAME_S = 0.02
WARMUP_S = 2.0  # first connection loads the agent and a genai client: not per-session-minute cost


def _reply(ctx: Any) -> str:
    """Odd turns: a short reply that completes; even turns: one the next question cuts."""
    if ctx.turn % 2:
        return "Sure, a short answer."  # ~1.4 s of speech: done before the next turn
    return "Here is a much longer answer that goes on and on until you interrupt it."


def _figures() -> dict[str, Any]:
    return {"up_frames": 0, "down_bytes": 0, "down_chunks": 0, "interrupted": 0,
            "turn_complete": 0, "errors": []}


async def _talk(session: AdkLiveSession, user: int, stop: Any, figures: dict[str, Any]) -> None:
    """Real-time microphone until `stop`: stamped noise for SPEAK_S of every CYCLE_S, else silence."""
    import anyio

    from bench.stats import up_frame

    silence = bytes(640)
    start = time.monotonic()
    seq = 0
    while not stop.is_set():
        delay = start + seq * FRAME_S - time.monotonic()
        if delay > 0:
            await anyio.sleep(delay)
        speaking = (seq * FRAME_S) % CYCLE_S < SPEAK_S
        await session.send_audio(up_frame(user, seq, time.monotonic_ns()) if speaking else silence)
        figures["up_frames"] += 1
        seq += 1


async def _listen(session: AdkLiveSession, figures: dict[str, Any]) -> None:
    async for event in session.events():
        kind = event[0]
        if kind == "audio":
            figures["down_bytes"] += len(event[1])
            figures["down_chunks"] += 1
        elif kind == "interrupted":
            figures["interrupted"] += 1
        elif kind == "turn_complete":
            figures["turn_complete"] += 1
        else:
            figures["errors"].append(event[1:])


def _heard_by_user(records: list[Any]) -> dict[int, int]:
    """Audio chunks the emulator received, by the user id stamped in each session's first frame."""
    from bench.stats import MAGIC, UP

    heard: dict[int, int] = {}
    for record in records:
        if len(record.audio) >= UP.size:
            magic, user, _, _ = UP.unpack_from(record.audio)
            if magic == MAGIC:
                heard[user] = heard.get(user, 0) + record.audio_chunks
    return heard


async def selftest(sessions: int = 2, seconds: float = 8.0) -> int:
    """Emulator + ADK server + `sessions` users; prints what flowed and what ADK cost.

    CPU is measured over `seconds` after every session is connected and WARMUP_S
    has passed, so the agent's first load is not counted as per-session cost.
    """
    import anyio

    from connections.emulator import running_emulator
    from connections.emulator.script import Script

    print(status())
    if not installed():
        return 1
    figures = [_figures() for _ in range(sessions)]
    async with running_emulator(Script(replies=_reply)) as emulator:
        server = await anyio.to_thread.run_sync(
            lambda: AdkServer.start(
                base_url=emulator.base_url, api_key=emulator.api_key, ca_file=emulator.ca_file
            )
        )
        try:
            idle_rss = server.rss_bytes()
            stop = anyio.Event()
            connected: list[int] = []
            all_connected = anyio.Event()

            async def user(i: int) -> None:
                async with AdkLiveSession.connect(server.url, f"selftest-{i}") as session:
                    connected.append(i)
                    if len(connected) == sessions:
                        all_connected.set()
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(_listen, session, figures[i])
                        await _talk(session, i + 1, stop, figures[i])
                        await anyio.sleep(0.5)  # the last reply chunks in flight
                        tg.cancel_scope.cancel()

            async with anyio.create_task_group() as tg:
                for i in range(sessions):
                    tg.start_soon(user, i)
                with anyio.fail_after(60):
                    await all_connected.wait()
                await anyio.sleep(WARMUP_S)
                cpu0, t0 = server.cpu_seconds(), time.monotonic()
                await anyio.sleep(seconds)
                cpu, window = server.cpu_seconds() - cpu0, time.monotonic() - t0
                rss = server.rss_bytes()
                stop.set()
        finally:
            await anyio.to_thread.run_sync(server.stop)
        heard = _heard_by_user(emulator.sessions)
    ok = True
    for i, f in enumerate(figures):
        up_at_model = heard.get(i + 1, 0)
        print(
            f"session {i + 1}: up {f['up_frames']} frames sent, {up_at_model} reached the "
            f"emulator; down {f['down_chunks']} audio chunks ({f['down_bytes'] / 48_000:.1f} s "
            f"of 24 kHz audio), {f['turn_complete']} turns complete, {f['interrupted']} "
            f"interrupted, errors {f['errors'] or 'none'}"
        )
        ok = ok and up_at_model > 0 and f["down_chunks"] > 0 and not f["errors"]
    session_minutes = sessions * window / 60
    print(
        f"ADK {ADK_VERSION} server: {cpu:.2f} CPU s over {window:.1f} s with {sessions} sessions "
        f"= {cpu / session_minutes:.2f} CPU s per session-minute (after {WARMUP_S:g} s warm-up); "
        f"RSS {idle_rss / 2**20:.0f} MiB idle, {rss / 2**20:.0f} MiB with the sessions"
    )
    print("audio flowed both ways" if ok else "FAILED: audio did not flow both ways")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.adk_peer", description=__doc__.split("\n")[0])
    p.add_argument("--install", action="store_true", help=f"create {VENV} with google-adk=={ADK_VERSION}")
    p.add_argument("--status", action="store_true", help="say whether the peer can run")
    p.add_argument("--selftest", action="store_true", help="run 2 sessions through ADK to the emulator")
    p.add_argument("--sessions", type=int, default=2)
    p.add_argument("--duration", type=float, default=8.0, help="seconds of talk (selftest)")
    args = p.parse_args(argv)
    if args.install:
        print(install())
        if not installed():
            return 1
    if args.selftest:
        import anyio

        return anyio.run(selftest, args.sessions, args.duration)
    if args.status or not args.install:
        print(status())
    return 0


if __name__ == "__main__":
    sys.exit(main())
