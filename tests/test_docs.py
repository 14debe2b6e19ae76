"""The documentation as a newcomer meets it: the site builds, links resolve, and
the front-door example of docs/front-doors.md runs against a real server."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from connections import double
from connections.gemini import Gemini
from live.agent import Agent
from live.doors import NativeDoor
from serving import running

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def test_the_site_builds_with_every_link_and_anchor_resolved(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reference = (tmp_path / "site/reference/doors/index.html").read_text()
    assert "FrontDoor" in reference and "opening" in reference  # generated from the docstrings


def _anchors(markdown: str) -> set[str]:
    from markdown.extensions.toc import slugify

    return {slugify(title, "-") for title in re.findall(r"^#+ (.+)$", markdown, flags=re.M)}


def test_the_readme_is_short_and_its_links_reach_pages_that_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    links = re.findall(r"\]\(((?!https?:)[^)#]+)(#[^)]*)?\)", readme)
    assert len(links) >= 10
    for target, anchor in links:
        path = ROOT / target
        assert path.exists(), f"README links to {target}, which does not exist"
        if anchor:
            assert anchor[1:] in _anchors(path.read_text()), f"{target} has no heading for {anchor}"


def _front_door_example() -> dict:
    """The minimal door, as docs/front-doors.md shows it."""
    page = (DOCS / "front-doors.md").read_text()
    [code] = [block for block in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "class RawPcmDoor" in block]
    namespace: dict = {}
    exec(compile(code, "docs/front-doors.md", "exec"), namespace)
    return namespace


MIC = b"\x10\x00" * 320  # 20 ms at 16 kHz
REPLY = bytes(range(256)) * 15  # 80 ms at 24 kHz


async def _next_text(ws) -> str:
    with anyio.fail_after(5):
        while True:
            frame = await ws.recv()
            if isinstance(frame, str):
                return frame


@pytest.mark.anyio
async def test_the_documented_minimal_front_door_serves_a_whole_conversation():
    RawPcmDoor = _front_door_example()["RawPcmDoor"]
    session = double.ScriptedSession()
    session.on(lambda m: session.audio_bytes >= 5 * len(MIC), double.audio(REPLY), double.turn_complete())
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport(session))
    agent = Agent(name="raw", model="gemini-2.5-flash")
    async with running(agent, llm, doors={"/live": NativeDoor, "/raw": RawPcmDoor}) as (server, url):
        async with ws_connect(url.replace("/live", "/raw")) as ws:
            await ws.send("start")
            for _ in range(5):
                await ws.send(MIC)
            with anyio.fail_after(5):
                assert await ws.recv() == REPLY  # the reply, as raw PCM
            assert session.audio_bytes == 5 * len(MIC)  # the model heard the PCM the door took
            # A frame the door cannot read is answered, and the session goes on.
            await ws.send("dance")
            assert (await _next_text(ws)).startswith("error unknown_command: unknown command 'dance'")
            # A barge-in: the door's own word for it, before anything else.
            session.push(double.audio(REPLY), double.interrupted())
            frames = []
            with anyio.fail_after(5):
                while "flush" not in frames:
                    frames.append(await ws.recv())
            await ws.send("stop")
            with pytest.raises(ConnectionClosed) as closed:
                with anyio.fail_after(5):
                    while True:
                        await ws.recv()
            assert closed.value.rcvd.code == 1000


@pytest.mark.anyio
async def test_a_front_door_gets_the_servers_checks_its_credential_refused_like_any_other():
    RawPcmDoor = _front_door_example()["RawPcmDoor"]
    llm = Gemini("gemini-2.5-flash", transport=double.DoubleTransport(double.ScriptedSession()))
    agent = Agent(name="raw", model="gemini-2.5-flash")
    async with running(agent, llm, doors={"/raw": RawPcmDoor}, token="s3cret") as (_, url):
        raw = url.replace("/live", "/raw")
        async with ws_connect(raw) as ws:
            await ws.send("start wrong")
            assert (await _next_text(ws)).startswith("error unauthorized:")
            with pytest.raises(ConnectionClosed) as closed:
                with anyio.fail_after(5):
                    while True:
                        await ws.recv()
            assert closed.value.rcvd.code == 1008
        async with ws_connect(raw) as ws:
            await ws.send("start s3cret")
            await ws.send(MIC)
            await ws.send("stop")
            with pytest.raises(ConnectionClosed) as closed:
                with anyio.fail_after(5):
                    while True:
                        await ws.recv()
            assert closed.value.rcvd.code == 1000
        # The server's own protocol is not served here: only the doors it was given.
        with pytest.raises(Exception):
            async with ws_connect(url):
                pass
