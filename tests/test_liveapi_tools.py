"""Conformance rows F (toolResponse) of the Live API endpoint
(docs/gemini-endpoint.md, "Conformance"): an app's results for the model's
asynchronous calls, streamed (`willContinue`), scheduled (`scheduling`) and
with files (`parts`), sent with google-genai's own `send_tool_response` and
only its base URL changed.

From the Live API's tool guide (ai.google.dev/gemini-api/docs/live-tools,
"Asynchronous function calling"): a function declared `NON_BLOCKING` runs while
the model goes on talking, and its response says, by its `scheduling`, what the
model does with it: INTERRUPT, tell the user at once; WHEN_IDLE, after what it
is saying; SILENT, take it in and say nothing of it. google-genai's
FunctionResponse (the reference's words): `will_continue` "Signals that
function call continues, and more responses will be returned, turning the
function call into a generator. Is only applicable to NON_BLOCKING function
calls ... If set to false, future responses will not be considered";
`scheduling`: "SILENT: Only add the result to the conversation context, do not
interrupt or trigger generation. WHEN_IDLE: Add the result to the conversation
context, and prompt to generate output without interrupting ongoing generation.
INTERRUPT: Add the result to the conversation context, interrupt ongoing
generation and prompt to generate output"; `parts`: "Ordered `Parts` that
constitute a function response. Parts may have different IANA MIME types."
"""

from __future__ import annotations

import base64
import io
import json

import anyio
import pytest
from emulated import MODEL
from gemini_serving import (
    CONFIG,
    app_client,
    said,
    serving,
    token,
    turn,
)
from google.genai import types
from PIL import Image as PILImage

from connections.emulator import ReplyContext, Script
from live.liveapi import get_field

pytestmark = pytest.mark.anyio

TRACK = types.FunctionDeclaration(
    name="track_order",
    description="Where an order is; its status comes as it changes.",
    parameters=types.Schema(type="OBJECT", properties={"order": types.Schema(type="STRING")}),
    behavior=types.Behavior.NON_BLOCKING,
)
ASYNC_CONFIG = CONFIG.model_copy(update={"tools": [types.Tool(function_declarations=[TRACK])]})


def reports(ctx: ReplyContext) -> str:
    """The model tells each status it was given, and how many statuses it knows
    of by then (the results in its context, SILENT ones among them)."""
    if not ctx.tool_results:
        return f"You said: {ctx.user_text}."
    known = sum(1 for turn in ctx.history for part in turn.get("parts", ()) if "functionResponse" in part)
    statuses = ", ".join(str((r.get("response") or {}).get("status")) for r in ctx.tool_results)
    return f"The order is {statuses}; {known} updates so far."


async def call_and_filler(session) -> tuple[types.FunctionCall, list[types.LiveServerMessage]]:
    """Ask for the non-blocking tool: its call, and the turn the model says meanwhile."""
    await session.send_realtime_input(text="please track_order 42")
    call = None
    seen = []
    with anyio.fail_after(10):
        async for message in session.receive():
            seen.append(message)
            if message.tool_call:
                [call] = message.tool_call.function_calls
    assert call is not None, "no call before the turn's end"
    return call, seen


async def test_F6_F7_a_streamed_result_reaches_the_model_as_each_response_schedules_it(trusted, cert_files):
    script = Script(speed=20, replies=reports, tool_args={"track_order": {"order": "42"}})
    async with serving(script, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=ASYNC_CONFIG) as session:
            call, filler = await call_and_filler(session)
            assert said(filler) == "Let me check."  # the model went on talking: the call does not block it

            def update(status: str, scheduling: types.FunctionResponseScheduling | None, more: bool | None):
                return types.FunctionResponse(
                    id=call.id, name=call.name, response={"status": status}, scheduling=scheduling, will_continue=more
                )

            # SILENT, more to come: taken in, nothing said of it.
            await session.send_tool_response(function_responses=[update("packed", types.FunctionResponseScheduling.SILENT, True)])
            # WHEN_IDLE, more to come: the model speaks of it, and of the one it took in silently.
            await session.send_tool_response(function_responses=[update("shipped", types.FunctionResponseScheduling.WHEN_IDLE, True)])
            shipped = await turn(session)
            # The last (no willContinue): the call ends with it, and it is spoken of too.
            await session.send_tool_response(function_responses=[update("delivered", None, None)])
            delivered = await turn(session)
        assert said(shipped) == "The order is shipped; 2 updates so far."
        assert said(delivered) == "The order is delivered; 3 updates so far."
        assert not any(m.tool_call or m.tool_call_cancellation for m in shipped + delivered)
        [upstream] = emu.sessions
        sent = [
            (get_field(r, "id"), get_field(r, "response"), get_field(r, "scheduling"), get_field(r, "willContinue"))
            for r in upstream.tool_responses
        ]
        assert sent == [
            (call.id, {"status": "packed"}, "SILENT", True),
            (call.id, {"status": "shipped"}, "WHEN_IDLE", True),
            (call.id, {"status": "delivered"}, None, None),
        ]


SHIPPED = "The order has shipped and is on its way through the sorting centre, then the van, then your door."


def long_reply(ctx: ReplyContext) -> str:
    if not ctx.tool_results:
        return f"You said: {ctx.user_text}."
    status = (ctx.tool_results[0].get("response") or {}).get("status")
    return SHIPPED if status == "shipped" else f"Stop: the order is {status}."


async def test_F7_an_interrupting_result_cuts_what_the_model_is_saying(trusted, cert_files):
    script = Script(speed=2, replies=long_reply, tool_args={"track_order": {"order": "42"}})
    async with serving(script, **cert_files) as (_, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=ASYNC_CONFIG) as session:
            call, _ = await call_and_filler(session)
            await session.send_tool_response(
                function_responses=[types.FunctionResponse(
                    id=call.id, name=call.name, response={"status": "shipped"}, will_continue=True,
                )]
            )
            seen = []
            with anyio.fail_after(10):
                async for message in session.receive():
                    seen.append(message)
                    if said(seen):  # the model is telling the first status
                        break
            await session.send_tool_response(
                function_responses=[types.FunctionResponse(
                    id=call.id, name=call.name, response={"status": "lost"},
                    scheduling=types.FunctionResponseScheduling.INTERRUPT,
                )]
            )
            cut = seen + await turn(session)
            told = await turn(session)
        contents = [m.server_content for m in cut if m.server_content]
        assert any(c.interrupted for c in contents) and contents[-1].turn_complete
        assert SHIPPED.startswith(said(cut)) and said(cut) != SHIPPED  # cut short, never finished
        assert said(told) == "Stop: the order is lost."


async def test_F5_a_result_with_a_file_reaches_the_model_whole(trusted, cert_files):
    picture = io.BytesIO()
    PILImage.new("RGB", (40, 30), (30, 30, 200)).save(picture, "PNG")
    png = picture.getvalue()
    script = Script(speed=20, replies=reports, tool_args={"track_order": {"order": "42"}})
    async with serving(script, **cert_files) as (emu, _, url):
        async with app_client(url, token()).aio.live.connect(model=MODEL, config=ASYNC_CONFIG) as session:
            call, _ = await call_and_filler(session)
            await session.send_tool_response(
                function_responses=[types.FunctionResponse(
                    id=call.id, name=call.name, response={"status": "photographed"},
                    parts=[types.FunctionResponsePart(
                        inline_data=types.FunctionResponseBlob(mime_type="image/png", data=png)
                    )],
                )]
            )
            messages = await turn(session)
        assert said(messages) == "The order is photographed; 1 updates so far."
        [upstream] = emu.sessions
        [response] = upstream.tool_responses
        [part] = get_field(response, "parts")
        blob = get_field(part, "inlineData")
        assert get_field(blob, "mimeType") == "image/png"
        assert base64.urlsafe_b64decode(get_field(blob, "data")) == png
        assert json.loads(json.dumps(get_field(response, "response"))) == {"status": "photographed"}
