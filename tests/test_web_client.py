"""The web client where users meet trouble: other capture rates, pages off
localhost, echo, a denied or slow microphone, dropped connections, failed loads.

Each test drives the demo page (or `LiveClient` itself) in Debian Chromium
against a real server with the scripted Gemini double. Browser behaviour that
Chromium does not have (refusing a 16 kHz capture context, a permission prompt
the user answers late, a denial) is reproduced by an init script that replaces
the one browser call involved, the way those browsers behave.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import anyio
import pytest
from websockets.asyncio.server import serve as ws_serve

from audio_fixtures import speak
from browsers import chromium_page, press_talk, http_root, scripted, speech_wav, start_talking, stats, wait_until
from connections import double
from connections.gemini import Gemini
from live.agent import Agent
from live.llm import AudioStreamEnd
from live.server.queues import JOIN_AUDIO_BYTES
from live.registry import default_registry
from live_audio import RecordingLlm, speech_found
from serving import running

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

AGENT = Agent(name="test", model="gemini-2.5-flash")
STEP = 24000 * 2 // 25  # 40 ms reply chunks, as Gemini sends them


def chunks(pcm: bytes) -> list:
    return [double.audio(pcm[i : i + STEP]) for i in range(0, len(pcm), STEP)]


async def state_text(page) -> str:
    return await page.text_content("#state")


# --------------------------------------------------------------------------- 1. capture rate

# Older Firefox releases and some Safari versions: a microphone cannot be
# connected to a context whose rate differs from the device's.
REFUSE_16K_CAPTURE = """
(() => {
  const original = AudioContext.prototype.createMediaStreamSource;
  AudioContext.prototype.createMediaStreamSource = function (stream) {
    if (this.sampleRate === 16000 || window.__refuseEveryRate) {
      throw new DOMException("Connecting AudioNodes from AudioContexts with different sample-rate is currently not supported.", "NotSupportedError");
    }
    return original.call(this, stream);
  };
})();
"""


async def test_a_browser_that_refuses_a_16_khz_capture_context_still_sends_16_khz_speech(tmp_path):
    wav, fed = speech_wav(tmp_path)
    llm, _ = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav, init_script=REFUSE_16K_CAPTURE) as page:
        await start_talking(page, url)
        assert await state_text(page) == "Listening"
        record = llm.sessions[0]

        async def heard_it_all():
            return len(b"".join(d for _, d in record.audio_in)) >= len(fed)

        await wait_until(heard_it_all, len(fed) / 32000 + 4, "the whole WAV to reach the server")
        sent = await stats(page)
    assert sent["captureRate"] != 16000  # the device's rate; the worklet resampled
    assert sent["bytesSent"] == 640 * sent["framesSent"]
    match = speech_found(fed, b"".join(d for _, d in record.audio_in))
    print(f"capture at {sent['captureRate']} Hz: {match.fraction:.0%} of speech blocks found")
    assert match.speech_blocks > 50 and match.fraction >= 0.7


async def test_a_microphone_that_cannot_be_connected_is_shown_not_hidden(tmp_path):
    wav, _ = speech_wav(tmp_path)
    llm, _ = scripted()
    script = "window.__refuseEveryRate = true;" + REFUSE_16K_CAPTURE
    async with running(AGENT, llm) as (_, url), chromium_page(wav, init_script=script) as page:
        await page.goto(http_root(url))
        await page.click("#talk")
        alert = page.locator("#log li.error")
        await alert.first.wait_for(timeout=5000)
        [shown] = await alert.all_text_contents()
        assert shown.startswith("microphone_unavailable:") and "NotSupportedError" in shown
        assert await state_text(page) == "Disconnected"
        assert await page.evaluate("window.live.state.microphone") is False
    assert llm.sessions == []  # no model session was opened for nothing


# --------------------------------------------------------------------------- 2. secure context


async def test_a_page_off_localhost_over_plain_http_says_it_needs_https(tmp_path):
    wav, _ = speech_wav(tmp_path)
    llm, _ = scripted()
    async with running(AGENT, llm, allowed_hosts=("voice.example",)) as (_, url):
        port = url.split(":")[2].split("/")[0]
        rules = ["--host-resolver-rules=MAP voice.example 127.0.0.1", "--no-proxy-server"]
        async with chromium_page(wav, args=rules) as page:
            await page.goto(f"http://voice.example:{port}/")
            assert await page.evaluate("window.isSecureContext") is False
            notice = page.locator("#notice")
            await notice.wait_for(state="visible", timeout=3000)
            text = await notice.text_content()
            assert "https://" in text and "--certfile" in text and "localhost" in text
            assert await page.is_disabled("#talk")
            assert await state_text(page) == "Not connected"  # not a hang at "Connecting…"
            # The library says the same to a page of its own, at once.
            code = await page.evaluate("""async () => {
                const { LiveClient } = await import("/client/live-client.js");
                const live = new LiveClient();
                try { await live.connect(); } catch (e) { return [e.code, live.state.connection]; }
            }""")
            assert code == ["insecure_context", "closed"]
    assert llm.sessions == []


async def test_the_same_page_off_localhost_over_tls_talks(tmp_path):
    """Served with --certfile/--keyfile under its own name, the page is a secure
    context: it asks for the microphone, opens the session over wss, and talks."""
    import trustme

    from test_tls import spki_hash

    wav, fed = speech_wav(tmp_path)
    cert = trustme.CA().issue_cert("voice.example")
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    for i, pem in enumerate(cert.cert_chain_pems):
        pem.write_to_path(str(certfile), append=i > 0)
    cert.private_key_pem.write_to_path(str(keyfile))
    llm, session = scripted()
    tls = dict(certfile=str(certfile), keyfile=str(keyfile), allowed_hosts=("voice.example",))
    async with running(AGENT, llm, **tls) as (_, url):
        port = url.split(":")[2].split("/")[0]
        args = ["--host-resolver-rules=MAP voice.example 127.0.0.1", "--no-proxy-server",
                f"--ignore-certificate-errors-spki-list={spki_hash(certfile)}"]
        async with chromium_page(wav, args=args) as page:
            await page.goto(f"https://voice.example:{port}/")
            assert await page.evaluate("window.isSecureContext") is True
            assert await page.is_hidden("#notice")
            await press_talk(page)
            record = llm.sessions[0]

            async def heard_speech():
                return len(b"".join(d for _, d in record.audio_in)) >= len(fed) // 2

            await wait_until(heard_speech, len(fed) / 32000 + 3, "speech to reach the server over wss")
            session.push(double.output_transcript("Loud and clear."), double.turn_complete())
            agent = page.locator("#log li[data-side=agent][data-final] .text")
            await agent.first.wait_for(timeout=5000)
            assert await agent.all_text_contents() == ["Loud and clear."]
            assert await page.locator("#log li.error").count() == 0


# --------------------------------------------------------------------------- 3. echo


async def test_by_default_the_page_mutes_the_microphone_while_the_agent_speaks(tmp_path):
    wav, _ = speech_wav(tmp_path)
    reply = speak("This answer must not come back through the microphone.", rate=24000)
    llm, session = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        assert await page.is_checked("#headphones") is False
        record = llm.sessions[0]
        t0 = time.monotonic()
        session.push(*chunks(reply), double.generation_complete(), double.turn_complete())
        await page.wait_for_function(
            "document.getElementById('state').textContent === 'Agent speaking — microphone muted'",
            timeout=3000,
        )

        async def played_out():
            s = await stats(page)
            return s if s["samplesPlayed"] >= len(reply) // 2 and not s["playing"] else None

        await wait_until(played_out, len(reply) / 48000 + 3, "the reply to play out")
        t1 = time.monotonic()
        await page.wait_for_function(
            "document.getElementById('state').textContent === 'Listening'", timeout=2000
        )
        await anyio.sleep(0.5)
        after = await stats(page)
    during = record.audio_between(t0 + 0.3, t1)
    print(f"half duplex: {len(during)} bytes sent during a {t1 - t0:.1f} s reply; "
          f"{after['framesGated']} frames held back")
    assert during == b""
    assert after["framesGated"] >= (t1 - t0 - 0.5) / 0.02
    assert any(isinstance(i, AudioStreamEnd) for _, i in record.other_in)  # audio.end at the mute
    assert record.audio_between(t1 + 0.6, 1e12)  # and the microphone came back


async def test_with_headphones_ticked_the_microphone_stays_open_for_barge_in(tmp_path):
    wav, _ = speech_wav(tmp_path)
    reply = speak("You may talk over me.", rate=24000)
    llm, session = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        await page.check("#headphones")
        record = llm.sessions[0]
        t0 = time.monotonic()
        session.push(*chunks(reply), double.generation_complete(), double.turn_complete())
        await page.wait_for_function(
            "document.getElementById('state').textContent === 'Agent speaking'", timeout=3000
        )
        await anyio.sleep(0.6)
        t1 = time.monotonic()
        s = await stats(page)
    assert s["framesGated"] == 0
    assert len(record.audio_between(t0 + 0.3, t1)) >= 640 * 10


# --------------------------------------------------------------------------- 4. reply tails


async def test_a_reply_tail_plays_when_the_turn_ends_without_generation_complete(tmp_path):
    """`turn.complete` (connection_lost) comes alone: 50 ms under the prebuffer must play."""
    wav, _ = speech_wav(tmp_path)
    llm, session = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        session.push(double.audio(speak("Hi", rate=24000)[: 2 * 1200]), double.turn_complete())

        async def played():
            s = await stats(page)
            return s if s["samplesPlayed"] == 1200 and s["queuedSamples"] == 0 else None

        await wait_until(played, 2, "the 50 ms tail to play")


async def test_a_reply_end_on_an_empty_queue_leaves_the_next_reply_its_prebuffer(tmp_path):
    wav, _ = speech_wav(tmp_path)
    llm, session = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        session.push(double.generation_complete(), double.turn_complete())
        await page.locator("#log li.turn-end").first.wait_for(timeout=3000)
        session.push(double.audio(bytes(2 * 600)))  # the first 25 ms of the next reply
        await wait_until(lambda: _received(page, 600), 2, "the chunk to arrive")
        await anyio.sleep(0.3)
        s = await stats(page)
    assert s["samplesPlayed"] == 0 and s["queuedSamples"] == 600  # waiting for 100 ms


async def _received(page, n: int) -> bool:
    return (await stats(page))["samplesReceived"] >= n


# --------------------------------------------------------------------------- 5. doubled words


async def test_an_interrupted_turn_shows_each_final_transcript_once(tmp_path):
    """`turn.interrupted` goes out ahead of the turn's final transcripts."""
    wav, _ = speech_wav(tmp_path)
    llm, session = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        session.push(
            double.input_transcript("Hello there,"),
            double.input_transcript(" can you hear me?"),
            double.output_transcript("Well, let me"),
        )
        await page.locator("#log li[data-side=agent]").wait_for(timeout=3000)
        session.push(double.interrupted(), double.turn_complete())  # the finals follow turn.interrupted
        await page.locator("#log li.turn-end", has_text="turn complete").wait_for(timeout=3000)
        you = await page.locator("#log li[data-side=you] .text").all_text_contents()
        agent = await page.locator("#log li[data-side=agent] .text").all_text_contents()
        ends = await page.locator("#log li.turn-end").all_text_contents()
    assert you == ["Hello there, can you hear me?"]
    assert agent == ["Well, let me"]
    assert ends == ["interrupted", "turn complete"]


async def test_the_tail_of_a_reply_that_comes_after_its_turn_ends_joins_its_line(tmp_path):
    """Gemini does not order transcripts with turns: the server marks the tail
    `late`, and the page puts it on the reply it belongs to."""
    wav, _ = speech_wav(tmp_path)
    llm, session = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        session.push(double.output_transcript("It is sunny"), double.turn_complete(),
                     double.output_transcript(" in Paris."))
        await page.locator("#log li.turn-end").first.wait_for(timeout=3000)
        await page.wait_for_function(
            "[...document.querySelectorAll('#log li[data-side=agent] .text')].some((e) => e.textContent.endsWith('Paris.'))",
            timeout=3000,
        )
        agent = await page.locator("#log li[data-side=agent] .text").all_text_contents()
    assert agent == ["It is sunny in Paris."]


async def test_the_module_gives_its_listeners_the_whole_reply_then_the_turns_end(tmp_path):
    """The loop docs/clients.md shows for a page (a listener per event type):
    the reply's final transcript comes with the tail Gemini sent after the
    turn ended folded in, and turn.complete after it; no separate tail."""
    wav, _ = speech_wav(tmp_path)
    llm, session = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        await page.evaluate(
            """() => {
              window.__read = [];
              window.live.on("transcript.output", (m) => window.__read.push([m.text, m.final, Boolean(m.late)]));
              window.live.on("turn.complete", () => window.__read.push(["turn.complete"]));
            }"""
        )
        session.push(double.output_transcript("It is sunny"), double.turn_complete(),
                     double.output_transcript(" in Paris."))
        await page.wait_for_function("window.__read.some((r) => r[0] === 'turn.complete')", timeout=3000)
        read = await page.evaluate("window.__read")
    assert read == [["It is sunny", False, False], ["It is sunny in Paris.", True, False], ["turn.complete"]]


# --------------------------------------------------------------------------- 6. microphone after the end

# A permission prompt the user answers after a while: getUserMedia resolves
# when the test calls window.__allow().
SLOW_PROMPT = """
(() => {
  const original = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
  window.__streams = [];
  window.__asked = 0;
  navigator.mediaDevices.getUserMedia = (constraints) => {
    window.__asked++;
    return new Promise((resolve, reject) => {
      window.__allow = () => original(constraints).then((s) => { window.__streams.push(s); resolve(s); }, reject);
    });
  };
})();
"""


async def test_ending_the_session_during_the_permission_prompt_leaves_the_microphone_off(tmp_path):
    wav, _ = speech_wav(tmp_path)
    llm, _ = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav, init_script=SLOW_PROMPT) as page:
        await page.goto(http_root(url))
        await page.click("#talk")
        await page.wait_for_function("window.__asked === 1", timeout=3000)
        assert await state_text(page) == "Asking for the microphone…"
        await page.click("#hangup")
        await page.evaluate("window.__allow()")
        await page.wait_for_function("window.__streams.length === 1", timeout=3000)
        await anyio.sleep(0.3)
        tracks = await page.evaluate("window.__streams[0].getTracks().map((t) => t.readyState)")
        assert tracks == ["ended"]  # the browser's recording indicator is off
        assert await page.evaluate("window.live.state") == {
            "connection": "closed", "microphone": False, "agentSpeaking": False, "microphoneGated": False,
        }
        assert await state_text(page) == "Disconnected"
        assert await page.locator("#log li.error").count() == 0  # the user's own choice
    assert llm.sessions == []


# --------------------------------------------------------------------------- 7. leaks and waits

COUNT_CONTEXTS = """
(() => {
  const Original = window.AudioContext;
  window.__contexts = [];
  window.AudioContext = class extends Original {
    constructor(...args) { super(...args); window.__contexts.push(this); }
  };
})();
"""


async def test_failed_connects_leave_no_audio_context_running(tmp_path):
    wav, _ = speech_wav(tmp_path)
    llm, _ = scripted()
    async with (
        running(AGENT, llm, token="s3cret") as (_, url),
        chromium_page(wav, init_script=COUNT_CONTEXTS) as page,
    ):
        await page.goto(http_root(url))
        for attempt in range(1, 4):
            await page.click("#talk")
            await page.locator("#log li.error").nth(attempt - 1).wait_for(timeout=5000)
            await page.wait_for_function("!document.getElementById('talk').disabled", timeout=3000)
        await anyio.sleep(0.3)
        states = await page.evaluate("window.__contexts.map((c) => c.state)")
    assert len(states) >= 3
    assert set(states) == {"closed"}, states


async def test_connect_gives_up_when_the_server_never_starts_the_session(tmp_path):
    wav, _ = speech_wav(tmp_path)
    llm, _ = scripted()

    async def silent(ws) -> None:
        async for _ in ws:  # reads session.start, never answers, until the client leaves
            pass

    async with (
        ws_serve(silent, "127.0.0.1", 0) as mute,
        running(AGENT, llm) as (_, url),
        chromium_page(wav) as page,
    ):
        mute_url = f"ws://127.0.0.1:{next(iter(mute.sockets)).getsockname()[1]}/live"
        await page.goto(http_root(url))
        result = await page.evaluate("""async (url) => {
            const { LiveClient } = await import("/client/live-client.js");
            const live = new LiveClient({ startTimeoutMs: 500 });
            const errors = [];
            live.on("error", (m) => errors.push(m.code));
            const t0 = performance.now();
            try { await live.connect(url); } catch (e) {
                return { code: e.code, after: performance.now() - t0, state: live.state.connection, errors };
            }
        }""", mute_url)
    assert result["code"] == "timeout" and result["state"] == "closed"
    assert result["errors"] == ["timeout"]
    assert 450 <= result["after"] < 3000


async def test_a_late_close_from_an_old_socket_does_not_end_the_new_session(tmp_path):
    wav, _ = speech_wav(tmp_path)
    llm = RecordingLlm(default_registry().resolve("local/echo"))
    async with running(Agent(name="echo", model="local/echo"), llm) as (_, url), chromium_page(wav) as page:
        await page.goto(http_root(url))
        state = await page.evaluate("""async () => {
            const { LiveClient } = await import("/client/live-client.js");
            const live = new LiveClient();
            await live.connect();
            const old = live._ws;
            await live.close();
            await live.connect();
            old.dispatchEvent(new CloseEvent("close", { code: 1006 }));
            await new Promise((r) => setTimeout(r, 100));
            return live.state.connection;
        }""")
        assert state == "open"
    assert len(llm.sessions) == 2


# Safari's rule (and Firefox's with media.autoplay.blocking_policy set): an
# AudioContext may start only while a user gesture is being handled. One made or
# resumed elsewhere stays suspended, and its resume() promise stays pending.
# Every context made is counted in window.__contexts.
AUDIO_ONLY_IN_A_GESTURE = """
(() => {
  const Original = window.AudioContext;
  const GESTURES = ["click", "keydown", "keyup", "pointerup", "mouseup", "touchend"];
  const inGesture = () => Boolean(window.event && window.event.isTrusted && GESTURES.includes(window.event.type));
  window.__contexts = [];
  window.AudioContext = class extends Original {
    constructor(...args) {
      super(...args);
      window.__contexts.push(this);
      this.__blocked = !inGesture();
      if (this.__blocked) Original.prototype.suspend.call(this);
    }
    resume() {
      if (this.__blocked && !inGesture()) return new Promise(() => {});
      this.__blocked = false;
      return super.resume();
    }
  };
})();
"""


async def test_reply_audio_plays_where_audio_may_only_start_from_the_click(tmp_path):
    """The speaker is made inside the click, before the microphone prompt's await."""
    wav, _ = speech_wav(tmp_path)
    reply = speak("Can you hear me now?", rate=24000)
    llm, session = scripted()
    async with (
        running(AGENT, llm) as (_, url),
        chromium_page(wav, init_script=AUDIO_ONLY_IN_A_GESTURE,
                      autoplay_policy="document-user-activation-required") as page,
    ):
        await start_talking(page, url)
        session.push(*chunks(reply), double.generation_complete(), double.turn_complete())

        async def played():
            s = await stats(page)
            return s if s["samplesPlayed"] >= len(reply) // 2 else None

        try:
            await wait_until(played, len(reply) / 48000 + 3, "the reply to play")
        finally:
            print("contexts:", await page.evaluate("window.__contexts.map((c) => [c.sampleRate, c.state])"),
                  "stats:", await stats(page))

        async def sending():  # the microphone's context runs too (muted while the reply played)
            s = await stats(page)
            return s if s["framesSent"] > 0 else None

        await wait_until(sending, 5, "the microphone to send")
        states = await page.evaluate("window.__contexts.map((c) => c.state)")
        assert states == ["running", "running"]  # one speaker, one microphone: nothing left over
        await page.click("#hangup")
        await page.wait_for_function("window.__contexts.every((c) => c.state === 'closed')", timeout=3000)


async def test_a_click_that_fails_leaves_no_audio_context_behind(tmp_path):
    """Denied, or refused by the server: each failed click closes what it made."""
    wav, _ = speech_wav(tmp_path)
    llm, _ = scripted()
    deny_once = "window.__deny = true;" + """
    const realGetUserMedia = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
    navigator.mediaDevices.getUserMedia = async (c) => {
      if (window.__deny) throw new DOMException("Permission denied", "NotAllowedError");
      return realGetUserMedia(c);
    };
    """
    async with (
        running(AGENT, llm, token="s3cret") as (_, url),
        chromium_page(wav, init_script=AUDIO_ONLY_IN_A_GESTURE + deny_once,
                      autoplay_policy="document-user-activation-required") as page,
    ):
        await page.goto(http_root(url))
        await page.click("#talk")  # denied
        await page.locator("#log li.error", has_text="microphone_denied").wait_for(timeout=5000)
        await page.evaluate("window.__deny = false")
        await page.click("#talk")  # allowed, but no token
        await page.locator("#log li.error", has_text="unauthorized").wait_for(timeout=5000)
        await page.wait_for_function("!document.getElementById('talk').disabled", timeout=3000)
        await anyio.sleep(0.3)
        states = await page.evaluate("window.__contexts.map((c) => c.state)")
    assert len(states) >= 3, states  # each click made its speaker and microphone contexts
    assert set(states) == {"closed"}, states
    assert llm.sessions == []


# What a worklet that cannot be fetched (a proxy, a broken deploy) looks like to the page.
FAIL_PLAYBACK_WORKLET = """
(() => {
  const original = AudioWorklet.prototype.addModule;
  AudioWorklet.prototype.addModule = function (url, options) {
    if (String(url).includes("playback-worklet")) {
      return Promise.reject(new DOMException("Unable to load a worklet's module.", "AbortError"));
    }
    return original.call(this, url, options);
  };
})();
"""


async def test_a_playback_worklet_that_fails_to_load_is_reported(tmp_path):
    wav, _ = speech_wav(tmp_path)
    llm, session = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav, init_script=FAIL_PLAYBACK_WORKLET) as page:
        await start_talking(page, url)
        alert = page.locator("#log li.error")
        await alert.first.wait_for(timeout=5000)
        assert (await alert.first.text_content()).startswith("playback_unavailable:")
        session.push(*chunks(bytes(2 * 24000)), double.output_transcript("Still here."),
                     double.turn_complete())
        await page.locator("#log li.turn-end").first.wait_for(timeout=3000)
        s = await stats(page)
        # Dropped as it came (a frame at a time: the server joins at most JOIN_AUDIO_BYTES), not piled up.
        assert s["samplesReceived"] == 24000 and s["playbackDropped"] >= math.ceil(2 * 24000 / JOIN_AUDIO_BYTES)
        assert await page.evaluate("window.live._playback.pending.length") == 0
        assert await state_text(page) == "Listening"  # the session goes on, text still shows
        assert await page.locator("#log li[data-side=agent] .text").all_text_contents() == ["Still here."]


# --------------------------------------------------------------------------- 8. a denied microphone

DENY = """
navigator.mediaDevices.getUserMedia = async () => {
  throw new DOMException("Permission denied", "NotAllowedError");
};
"""


async def test_a_denied_microphone_opens_no_model_session_and_says_how_to_allow_it(tmp_path):
    wav, _ = speech_wav(tmp_path)
    llm, _ = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav, init_script=DENY) as page:
        await page.goto(http_root(url))
        await page.click("#talk")
        alert = page.locator("#log li.error")
        await alert.first.wait_for(timeout=5000)
        [shown] = await alert.all_text_contents()
        assert shown.startswith("microphone_denied:")
        assert "address bar" in shown and "Start talking" in shown
        assert await state_text(page) == "Disconnected"
        assert not await page.is_disabled("#talk")  # it can be tried again
    assert llm.sessions == []


# --------------------------------------------------------------------------- 11. accessibility

AXE = Path(__file__).resolve().parent / "browser" / "node_modules" / "axe-core" / "axe.min.js"


async def axe_violations(page, when: str) -> list[dict]:
    """axe-core's audit of the page as it is now; prints every violation, returns the serious ones."""
    if not await page.evaluate("typeof window.axe === 'object'"):
        await page.add_script_tag(path=str(AXE))
    violations = await page.evaluate("""async () => {
        const result = await axe.run(document, { resultTypes: ["violations"] });
        return result.violations.map((v) => ({
            id: v.id, impact: v.impact, help: v.help,
            nodes: v.nodes.map((n) => ({ target: n.target.join(" "), summary: n.failureSummary })),
        }));
    }""")
    for v in violations:
        print(f"axe ({when}): {v['impact']} {v['id']}: {v['help']}")
        for node in v["nodes"]:
            print(f"    {node['target']}: {' '.join(node['summary'].split())}")
    return [v for v in violations if v["impact"] in ("serious", "critical")]


@pytest.mark.parametrize("scheme", ["light", "dark"])
async def test_the_demo_page_passes_an_axe_audit(tmp_path, scheme):
    """Every state the page shows, coloured text included (the error red, the "You"
    and "Agent" labels, muted notes, the pressed buttons), in light and dark mode."""
    if not AXE.exists():
        pytest.skip("axe-core is not installed (./test runs npm ci in tests/browser)")
    wav, _ = speech_wav(tmp_path)
    llm, session = scripted()
    session.on_tool_response(double.output_transcript("It is noon."), double.turn_complete())
    serious = {}
    async with running(AGENT, llm) as (_, url), chromium_page(wav, color_scheme=scheme) as page:
        await page.goto(http_root(url))
        serious["before connecting"] = await axe_violations(page, "before connecting")
        await start_talking(page, url)
        session.push(
            double.input_transcript("What time is it"),
            double.output_transcript("Let me look."),
            double.tool_call("get_page_time", {}, id="t-1"),
        )
        await page.locator("#log li.turn-end").first.wait_for(timeout=5000)
        session.push(double.input_transcript("And tomor"))  # a line still being spoken
        await page.locator("#log li[data-side=you]:not([data-final])").wait_for(timeout=3000)
        await page.evaluate("window.live._send({ type: 'no.such.message' })")  # a non-fatal error
        await page.locator("#log li.error").wait_for(timeout=3000)
        await page.click("#camera")
        await page.wait_for_function("window.live.state.video === 'camera'", timeout=5000)
        serious["in a session"] = await axe_violations(page, "in a session")
        await page.click("#hangup")
        await page.wait_for_function("document.getElementById('state').textContent === 'Disconnected'",
                                     timeout=5000)
        serious["after the session"] = await axe_violations(page, "after the session")
    assert {when: v for when, v in serious.items() if v} == {}


# Where a screen reader reads out changes by itself: live regions, and what is inside them.
SPOKEN_REGIONS = """(text) => [...document.querySelectorAll(
    '[aria-live]:not([aria-live=off]), [role=alert], [role=status], [role=log]')]
    .filter((region) => region.textContent.includes(text)).length"""


async def test_a_screen_reader_hears_finished_lines_not_fragments_and_each_error_once(tmp_path):
    wav, _ = speech_wav(tmp_path)
    llm, session = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        session.push(double.input_transcript("What is"), double.input_transcript(" the weather"),
                     double.output_transcript("It is"), double.output_transcript(" sunny"))
        await page.locator("#log li[data-side=agent]", has_text="sunny").wait_for(timeout=3000)
        assert await page.evaluate(SPOKEN_REGIONS, "the weather") == 0  # no fragment is read out
        assert await page.evaluate(SPOKEN_REGIONS, "sunny") == 0
        session.push(double.turn_complete())
        await page.locator("#log li.turn-end").wait_for(timeout=3000)
        # Once final, each line is read out, once, both of them.
        assert await page.evaluate(SPOKEN_REGIONS, "You: What is the weather") == 1
        assert await page.evaluate(SPOKEN_REGIONS, "Agent: It is sunny") == 1
        await page.evaluate("window.live._send({ type: 'no.such.message' })")
        await page.locator("#log li.error").wait_for(timeout=3000)
        assert await page.evaluate(SPOKEN_REGIONS, "unknown_type:") == 1


async def toggle_labels_and_states(page, selector: str, toggle) -> tuple[set, set]:
    """The button's label and aria-pressed before and after a toggle."""
    labels, pressed = set(), set()
    for _ in range(2):
        labels.add(await page.text_content(selector))
        pressed.add(await page.get_attribute(selector, "aria-pressed"))
        await toggle()
    return labels, pressed


async def test_toggle_buttons_change_their_state_or_their_label_not_both(tmp_path):
    """A screen reader says "Show camera, toggle button, pressed": a label that also
    flips to "Stop camera" reads as the opposite of what it does."""
    wav, _ = speech_wav(tmp_path)
    llm, _ = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)

        async def talk():
            on = await page.evaluate("window.live.state.microphone")
            await page.click("#talk")
            await page.wait_for_function(f"window.live.state.microphone === {str(not on).lower()}", timeout=5000)

        async def camera():
            on = await page.evaluate("window.live.state.video === 'camera'")
            await page.click("#camera")
            await page.wait_for_function(f"(window.live.state.video === 'camera') === {str(not on).lower()}",
                                         timeout=5000)

        found = {"#talk": await toggle_labels_and_states(page, "#talk", talk),
                 "#camera": await toggle_labels_and_states(page, "#camera", camera)}
        # The screen button is drawn by the same code as the camera's: its label stays while the camera runs.
        await camera()
        assert await page.get_attribute("#screen", "aria-pressed") == "false"
        found["#screen"] = ({await page.text_content("#screen")}, set())
    print(found)
    for selector, (labels, pressed) in found.items():
        assert len(labels) == 1 or pressed == {None}, (selector, labels, pressed)
    assert found["#camera"] == ({"Show camera"}, {"false", "true"})
    assert found["#screen"][0] == {"Share screen"}


async def test_typed_text_leaves_a_voice_transcript_in_progress_alone(tmp_path):
    wav, _ = speech_wav(tmp_path)
    llm, session = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        session.push(double.input_transcript("I was say"))
        await page.locator("#log li[data-side=you]").wait_for(timeout=3000)
        await page.fill("#text", "typed words")
        await page.click("#typed button")
        session.push(double.input_transcript("ing something"), double.turn_complete())
        await page.locator("#log li.turn-end").wait_for(timeout=3000)
        you = await page.locator("#log li[data-side=you] .text").all_text_contents()
    assert you == ["I was saying something", "typed words"]


async def test_after_a_new_session_the_text_starts_a_new_line(tmp_path):
    """The connection drops for good mid-sentence (no session.closed, no reattach):
    the next session's first words are not glued to the last ones of the old."""
    wav, _ = speech_wav(tmp_path)
    first, second = double.ScriptedSession(), double.ScriptedSession()
    llm = RecordingLlm(Gemini("gemini-2.5-flash", transport=double.DoubleTransport(first, second)))
    async with running(AGENT, llm, reattach_grace=0) as (server, url), chromium_page(wav) as page:
        await start_talking(page, url)
        first.push(double.output_transcript("Where was I"))
        await page.locator("#log li[data-side=agent]").wait_for(timeout=3000)
        [live] = list(server.sessions)
        live.ws.transport.abort()
        await page.wait_for_function("window.live.state.connection === 'closed'", timeout=5000)
        await page.click("#talk")
        await page.wait_for_function("window.live.state.connection === 'open'", timeout=5000)
        second.push(double.output_transcript("Hello again"))
        await page.locator("#log li[data-side=agent]", has_text="Hello again").wait_for(timeout=3000)
        agent = await page.locator("#log li[data-side=agent] .text").all_text_contents()
    assert agent == ["Where was I", "Hello again"]
