"""Conformance rows C27, C28 and H25 of the Live API endpoint
(docs/gemini-endpoint.md, "Conformance"): an app's own session resumption and
the service's goAway, driven with google-genai with only its base URL changed.

What the service does, in its own words. The Live API reference,
`SessionResumptionUpdate`: "Update of the session resumption state. Only sent
if `BidiGenerateContentSetup.sessionResumption` was set." `newHandle`: "New
handle that represents state that can be resumed. Empty if `resumable`=false."
`resumable`: "True if session can be resumed at this point. It might be not
possible to resume session at some points. In that case we send update empty
new_handle and resumable=false. Example of such case could be model executing
function calls or just generating." The session-management guide: "Passing
this configuration causes the server to send SessionResumptionUpdate messages,
which can be used to resume the session by passing the last resumption token
as the SessionResumptionConfig.handle of the subsequent connection.
Resumption tokens are valid for 2 hours after the last session termination."
And: "The server sends a GoAway message that signals that the current
connection will soon be terminated"; `GoAway.timeLeft`: "The remaining time
before the connection will be terminated as ABORTED."
"""

from __future__ import annotations

import dataclasses
import signal

import anyio
import pytest
from emulated import MODEL
from gemini_serving import (
    CONFIG,
    said,
    sdk_client,
    serving,
    token,
    turn,
)
from google.genai import errors, types
from test_fleet import Serving

from connections.emulator import ReplyContext, Script, running_emulator
from live.liveapi import DEADLINE_EXPIRED, SESSION_NOT_FOUND
from live.server.parking import ParkedSessions

pytestmark = pytest.mark.anyio

RESUMABLE = CONFIG.model_copy(update={"session_resumption": types.SessionResumptionConfig()})


def updates(messages: list[types.LiveServerMessage]) -> list[types.LiveSessionResumptionUpdate]:
    return [m.session_resumption_update for m in messages if m.session_resumption_update]


def knows(ctx: ReplyContext) -> str:
    """The model says what the user said in this turn and before it."""
    before = [
        part["text"]
        for content in ctx.history[:-1]
        if content.get("role") == "user"
        for part in content.get("parts", ())
        if "text" in part
    ]
    if ctx.tool_results:
        return f"{len(ctx.tool_results)} result(s) in."
    return f"You said: {ctx.user_text}; before: {', '.join(before) or 'nothing'}."


async def until(session, done, *, timeout: float = 10.0) -> list[types.LiveServerMessage]:
    """Messages (across turns) up to and including the first `done(message)`."""
    seen: list[types.LiveServerMessage] = []
    with anyio.fail_after(timeout):
        while True:
            async for message in session.receive():
                seen.append(message)
                if done(message):
                    return seen


async def quiet(session, seconds: float) -> list[types.LiveServerMessage]:
    """What arrives in `seconds` (nothing is expected to end it)."""
    seen: list[types.LiveServerMessage] = []
    with anyio.move_on_after(seconds):
        while True:
            async for message in session.receive():
                seen.append(message)
    return seen


async def test_C27_a_handle_after_each_turn_and_none_while_the_model_speaks_or_a_call_waits(ca, cert_files):
    script = Script(speed=4, replies=knows)
    config = RESUMABLE.model_copy(
        update={"tools": [types.Tool(function_declarations=[types.FunctionDeclaration(name="check_stock")])]}
    )
    async with serving(script, **cert_files) as (_, _, url):
        client = sdk_client(url, ca, token())
        async with client.aio.live.connect(model=MODEL, config=config) as session:
            # Set up: resumable at once, with a handle.
            opening = await until(session, lambda m: m.session_resumption_update is not None)
            [first] = updates(opening)
            assert first.resumable and first.new_handle

            await session.send_realtime_input(text="one")
            speaking = await turn(session)
            # While the model generates: "empty new_handle and resumable=false", and no handle.
            generating = updates(speaking)
            assert generating and all(u.resumable is False and not u.new_handle for u in generating)
            # The turn done, the session can be resumed again: a handle.
            after = await until(session, lambda m: m.session_resumption_update is not None)
            [done] = updates(after)
            assert done.resumable and done.new_handle

            # A call of the app's own function: not resumable while it is unanswered.
            await session.send_realtime_input(text="please check_stock")
            called = await until(session, lambda m: m.tool_call is not None)
            meanwhile = updates(called) + updates(await quiet(session, 1.0))
            assert meanwhile and not any(u.resumable for u in meanwhile)
            [call] = called[-1].tool_call.function_calls
            await session.send_tool_response(
                function_responses=[types.FunctionResponse(id=call.id, name=call.name, response={"count": 3})]
            )
            answered = await until(session, lambda m: bool(m.server_content and m.server_content.turn_complete))
            assert said(answered) == "1 result(s) in."
            again = await until(session, lambda m: m.session_resumption_update is not None)
            [resumable] = updates(again)
            assert resumable.resumable and resumable.new_handle
        # One live conversation, one handle for it until it is used (below, C28).
        assert first.new_handle == done.new_handle == resumable.new_handle


async def test_C28_the_latest_handle_finds_the_conversation_after_the_socket_ended_for_two_hours_not_more(
    ca, cert_files
):
    script = Script(speed=20, replies=knows)
    now = [0.0]
    async with serving(script, reattach_grace=0.3, **cert_files) as (emu, server, url):
        server.parked = ParkedSessions(clock=lambda: now[0])  # the server's two hours, told by this clock
        client = sdk_client(url, ca, token())

        async def talk(config: types.LiveConnectConfig, text: str) -> tuple[str, str]:
            async with client.aio.live.connect(model=MODEL, config=config) as session:
                await session.send_realtime_input(text=text)
                messages = await turn(session)
                messages += await until(session, lambda m: bool(m.session_resumption_update and m.session_resumption_update.new_handle))
            return said(messages), updates(messages)[-1].new_handle

        answer, handle = await talk(RESUMABLE, "one")
        assert answer == "You said: one; before: nothing."
        # The app's socket ended; past the wait with Google's connection open,
        # the session is held without it (parked).
        with anyio.fail_after(10):
            while len(server.parked) != 1 or emu.sessions[0].client_close is None:
                await anyio.sleep(0.05)
        now[0] += 7200 - 1  # not quite two hours later
        answer, handle = await talk(RESUMABLE.model_copy(update={"session_resumption": types.SessionResumptionConfig(handle=handle)}), "two")
        assert answer == "You said: two; before: one."  # its conversation
        assert emu.sessions[-1].resumed_from in emu.sessions[0].handles  # Google's session, resumed
        # Away again: two hours after this termination, the latest handle no longer resumes.
        with anyio.fail_after(10):
            while len(server.parked) != 1:
                await anyio.sleep(0.05)
        now[0] += 7200 + 1
        late = RESUMABLE.model_copy(update={"session_resumption": types.SessionResumptionConfig(handle=handle)})
        with pytest.raises(errors.APIError) as caught:
            with anyio.fail_after(10):
                async with client.aio.live.connect(model=MODEL, config=late) as session:
                    await turn(session)
        assert (caught.value.code, caught.value.details) == (1008, SESSION_NOT_FOUND)


async def test_H25_a_stopping_server_says_go_away_with_the_drains_time_lets_the_reply_end_then_closes(ca, cert_files):
    """One `live serve --gemini-endpoint` without a fleet, stopped with SIGTERM
    while the model answers: the app reads the service's goAway
    (`message.go_away.time_left`, the drain's), the rest of the reply, then
    the close in the service's words for a connection that reached its end."""
    script = Script(speed=2, replies=["A first short answer.", "A rather longer second answer that takes a while to say."])
    async with running_emulator(dataclasses.replace(script, profile_overrides={"late_transcripts": False})) as emu:
        tls = ("--certfile", cert_files["certfile"], "--keyfile", cert_files["keyfile"])
        server = Serving(emu.environment(), "--gemini-endpoint", "--drain-timeout", "20", *tls)
        try:
            client = sdk_client(f"wss://127.0.0.1:{server.port}/", ca, "any-key")
            async with client.aio.live.connect(model=MODEL, config=RESUMABLE) as session:
                await session.send_realtime_input(text="one")
                await turn(session, timeout=30)
                await session.send_realtime_input(text="two")
                started = await until(session, lambda m: bool(m.server_content and m.server_content.model_turn), timeout=30)
                server.proc.send_signal(signal.SIGTERM)
                after = list(started)
                with anyio.fail_after(30), pytest.raises(errors.APIError) as closed:
                    while True:
                        async for message in session.receive():
                            after.append(message)
            assert (closed.value.code, closed.value.details) == (1011, DEADLINE_EXPIRED)
            go_aways = [i for i, m in enumerate(after) if m.go_away]
            assert go_aways and after[go_aways[0]].go_away.time_left == "20.000s"
            # The reply in flight was let finish before the close: all of it was said.
            assert said(after) == "A rather longer second answer that takes a while to say."
            assert any(m.server_content and m.server_content.turn_complete for m in after[go_aways[0]:])
            assert server.proc.wait(timeout=30) == 0
            # No fleet carries the session on: the app coming back with its handle finds no server.
            handle = [u.new_handle for u in updates(after) if u.new_handle] or [None]
            again = RESUMABLE.model_copy(update={"session_resumption": types.SessionResumptionConfig(handle=handle[-1])})
            with pytest.raises(OSError), anyio.fail_after(10):
                async with client.aio.live.connect(model=MODEL, config=again):
                    pass
        finally:
            server.stop()

