"""What a stranger cannot do with the phone path: replay a webhook, use a call's
token elsewhere, open a stream Twilio did not sign, have the agent dial a
number of their choosing. The carrier's side follows Twilio's documentation."""

from __future__ import annotations

import json

import anyio
import pytest

from clients.phone_double import TwilioDouble, twilio_signature
from connections.emulator import Script, running_emulator
from emulated import gemini_for
from live.agent import Agent
from phone_serving import AUTH_TOKEN, running_phone, synthetic_ulaw

pytestmark = pytest.mark.anyio

MODEL = "gemini-live-2.5-flash-preview"


async def test_a_replayed_signed_webhook_mints_no_second_token():
    # Twilio "uses the parameters sent in the webhook ... and the exact URL your
    # application supplied to Twilio to create this signature": no time is signed,
    # so the same request, captured and sent again, carries a valid signature.
    agent = Agent(name="weather", model=MODEL)
    async with running_emulator(Script()) as emu, running_phone(agent, gemini_for(emu)) as phone:
        status, first, call_sid = await phone.double.ring(phone.webhook_url)
        assert status == 200 and "<Stream" in first
        for _ in range(3):
            status, again, _ = await phone.double.ring(phone.webhook_url, call_sid=call_sid)
            assert status == 409 and "token" not in again and "<Stream" not in again
        # The first answer's token still opens its call's one stream.
        async with phone.double.call(phone.webhook_url, stream_url=phone.media_url, answer=first, call_sid=call_sid) as call:
            await call.silence(0.5)
            assert call.closed is None
        assert len(emu.sessions) == 1
        exposition = phone.server.metrics.exposition()[0].decode()
        assert 'live_phone_webhooks_total{answer="replayed",carrier="twilio"} 3.0' in exposition
        assert 'live_phone_webhooks_total{answer="stream",carrier="twilio"} 1.0' in exposition


async def test_a_calls_token_is_refused_on_live_even_with_the_servers_token_secret():
    from clients.client import LiveClient, SessionRefused

    secret = "s" * 40
    agent = Agent(name="weather", model=MODEL)
    # The server's --token-secret also signs the calls' tokens (live serve shares it).
    async with running_emulator(Script()) as emu, running_phone(agent, gemini_for(emu), token_secret=secret) as phone:
        _, twiml, _ = await phone.double.ring(phone.webhook_url)
        _, params = TwilioDouble.stream_of(twiml)
        live_url = phone.media_url.replace("/twilio/media", "/live")
        with pytest.raises(SessionRefused) as refused:
            async with LiveClient.connect(live_url, token=params["token"], reattach_for=0):
                pass
        assert refused.value.code == "unauthorized" and params["token"] not in refused.value.message
        assert emu.sessions == []


async def test_a_stream_handshake_twilio_did_not_sign_opens_nothing():
    # "You must also configure your application to validate the X-Twilio-Signature
    # header. This is how your application verifies that a Media Stream is coming
    # from an authentic Twilio source." What URL is signed is not written down: the
    # strictest reading is the <Stream url> exactly, with no parameters.
    agent = Agent(name="weather", model=MODEL)
    async with running_emulator(Script()) as emu, running_phone(agent, gemini_for(emu)) as phone:
        for headers in ({}, {"x-twilio-signature": twilio_signature("f" * 32, phone.lines.twilio_webhook.stream_url, {})},
                        {"x-twilio-signature": twilio_signature(AUTH_TOKEN, phone.media_url + "?x=1", {})}):
            async with phone.call(handshake=headers) as call:
                with anyio.fail_after(3):
                    while call.closed is None:
                        await anyio.sleep(0.02)
            assert call.closed[0] == 1008 and not call.heard.media
        assert emu.sessions == []
        async with phone.call() as call:  # signed as Twilio signs it
            await call.silence(0.3)
            assert call.closed is None


async def test_webhooks_signed_by_a_webhooks_rule_with_hmac_sha256_are_taken():
    # "If a Webhooks Rule matches the webhook URL, Twilio signs with the Setting's
    # SharedKey and algorithm instead, and adds this header:
    # X-Twilio-Webhooks-Signature-Settings: key=<...>,algorithm=HMAC_SHA256".
    shared = "sk_" + "3" * 32
    agent = Agent(name="weather", model=MODEL)
    async with running_emulator(Script()) as emu, running_phone(agent, gemini_for(emu), twilio_shared_key=shared) as phone:
        rule = TwilioDouble(AUTH_TOKEN, phone.double.account_sid, shared_key=shared)
        status, twiml, _ = await rule.ring(phone.webhook_url)
        assert status == 200 and "<Stream" in twiml
        async with rule.call(phone.webhook_url, stream_url=phone.media_url) as call:
            await call.silence(0.3)
            assert call.closed is None
        # Signed with another key, or the settings header without a key here: refused.
        wrong = TwilioDouble(AUTH_TOKEN, phone.double.account_sid, shared_key="sk_" + "4" * 32)
        assert (await wrong.ring(phone.webhook_url))[0] == 403
    async with running_emulator(Script()) as emu, running_phone(agent, gemini_for(emu)) as phone:
        assert (await rule.ring(phone.webhook_url))[0] == 403


async def test_a_replay_to_another_server_of_the_fleet_is_refused_too():
    from live.fleet.store import MemoryStore
    from live.phone.calls import CallTokens
    from live.phone.webhooks import TwilioVoiceWebhook

    store = MemoryStore()  # what the servers of a fleet share (Redis in production)
    secret = "f" * 40
    servers = [TwilioVoiceWebhook(AUTH_TOKEN, "https://voice.example.com", CallTokens(secret, store=store))
               for _ in range(2)]
    double = TwilioDouble(AUTH_TOKEN)
    form = {"AccountSid": double.account_sid, "CallSid": "CA" + "7" * 32, "From": "+15550100001", "To": "+15550100002"}
    url = "https://voice.example.com/twilio/voice"
    body = "&".join(f"{k}={v}" for k, v in form.items()).replace("+", "%2B").encode()
    headers = {"x-twilio-signature": twilio_signature(AUTH_TOKEN, url, form)}
    first = await servers[0].answer("/twilio/voice", headers, body)
    replay = await servers[1].answer("/twilio/voice", headers, body)
    assert first.status == 200 and b"<Stream" in first.body
    assert replay.status == 409


@pytest.mark.parametrize("said", ["+1 900 555 0199", "+882 1234 5678", "the operator", "sales; +15550000000"])
async def test_transfer_to_anything_but_a_configured_destination_is_refused_with_no_rest_request(said, caplog):
    from live.phone.control import transfer_to

    agent = Agent(name="desk", model=MODEL, tools=[transfer_to({"sales": "+15551234567"})])
    script = Script(user_says=["please transfer_call"], tool_args={"transfer_call": {"destination": said}})
    async with running_emulator(script) as emu, running_phone(agent, gemini_for(emu), control="double") as phone:
        async with phone.call() as call:
            await call.speak(synthetic_ulaw(), silence_after=0.2)
            await call.wait_for_audio(timeout=10)
            await call.silence(0.5)
            assert call.closed is None  # still talking with the agent
        [session] = emu.sessions
    assert phone.double.rest.requests == []  # nothing dialled
    responses = [json.dumps(f) for f in session.frames if "toolResponse" in f or "tool_response" in f]
    assert responses and "not a transfer destination" in responses[0] and "sales" in responses[0]
    assert "refused" in caplog.text


async def test_a_failed_transfer_comes_back_to_the_agent_as_the_tools_result():
    from live.phone.control import transfer_to

    agent = Agent(name="desk", model=MODEL, tools=[transfer_to({"sales": "+15551234567"})])
    script = Script(user_says=["please transfer_call"], tool_args={"transfer_call": {"destination": "sales"}})
    async with running_emulator(script) as emu, running_phone(agent, gemini_for(emu), control="double") as phone:
        phone.double.rest.fail_next = 500  # Twilio's REST API answers with an error
        async with phone.call() as call:
            await call.speak(synthetic_ulaw(), silence_after=0.2)
            await call.wait_for_audio(timeout=10)
            assert call.closed is None
        [session] = emu.sessions
    responses = [json.dumps(f) for f in session.frames if "toolResponse" in f or "tool_response" in f]
    assert responses and "did not go through" in responses[0]


def test_the_stream_url_keeps_the_public_urls_path_and_is_wss_only():
    from live.phone.webhooks import check_stream_url, stream_url_for

    # "On successful execution, Twilio establishes a wss WebSocket connection to
    # the URL"; "wss is the only supported protocol"; "The url does not support
    # query string parameters".
    assert stream_url_for("https://example.com/voice/", "/twilio/media") == "wss://example.com/voice/twilio/media"
    assert stream_url_for("https://example.com", "/twilio/media") == "wss://example.com/twilio/media"
    for bad in ("http://example.com", "https://example.com/?key=1"):
        with pytest.raises(ValueError):
            stream_url_for(bad, "/twilio/media")
    for bad in ("ws://media.example.com/twilio/media", "wss://media.example.com/twilio/media?token=1"):
        with pytest.raises(ValueError):
            check_stream_url(bad)
    assert stream_url_for("http://127.0.0.1:8766", "/twilio/media") == "ws://127.0.0.1:8766/twilio/media"


async def test_the_webhook_behind_a_path_is_signed_and_streamed_under_that_path():
    from live.phone.calls import CallTokens
    from live.phone.webhooks import TwilioVoiceWebhook

    webhook = TwilioVoiceWebhook(AUTH_TOKEN, "https://example.com/voice/", CallTokens())
    double = TwilioDouble(AUTH_TOKEN)
    form = {"AccountSid": double.account_sid, "CallSid": "CA" + "8" * 32}
    signed = {"x-twilio-signature": twilio_signature(AUTH_TOKEN, "https://example.com/voice/twilio/voice", form)}
    answer = await webhook.answer("/twilio/voice", signed, "&".join(f"{k}={v}" for k, v in form.items()).encode())
    assert answer.status == 200
    url, _ = TwilioDouble.stream_of(answer.body.decode())
    assert url == "wss://example.com/voice/twilio/media"


async def test_a_status_callback_is_checked_and_reported():
    from live.phone.calls import CallTokens
    from live.phone.webhooks import TwilioVoiceWebhook

    seen = []
    webhook = TwilioVoiceWebhook(AUTH_TOKEN, "https://example.com", CallTokens())
    webhook.on_status = seen.append
    form = {"CallSid": "CA" + "9" * 32, "CallStatus": "no-answer", "AccountSid": "AC1"}
    url = "https://example.com/twilio/status"
    body = "&".join(f"{k}={v}" for k, v in form.items()).encode()
    ok = await webhook.status("/twilio/status", {"x-twilio-signature": twilio_signature(AUTH_TOKEN, url, form)}, body)
    forged = await webhook.status("/twilio/status", {"x-twilio-signature": twilio_signature("x" * 32, url, form)}, body)
    assert ok.status == 200 and forged.status == 403
    assert seen == [{"CallSid": form["CallSid"], "CallStatus": "no-answer"}]
