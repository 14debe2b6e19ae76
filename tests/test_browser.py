"""The browser client in Debian Chromium, against a real server on a loopback port.

A spoken WAV is Chromium's fake microphone (it plays in real time from the
moment the page opens the microphone); the scripted Gemini double answers with
transcripts, audio and turn ends; the page is driven through its demo UI and
read through `window.live.stats()`.
"""

from __future__ import annotations

import re
import time

import anyio
import pytest

from audio_fixtures import speak
from browsers import chromium_page, press_talk, http_root, scripted, speech_wav, start_talking, stats, wait_until
from connections import double
from live.agent import Agent
from live_audio import speech_found
from serving import running

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

AGENT = Agent(name="test", model="gemini-2.5-flash")


async def test_speech_reaches_the_server_and_the_page_shows_and_plays_the_reply(tmp_path):
    wav, fed = speech_wav(tmp_path)
    reply = speak("Yes, I hear you.", rate=24000)
    llm, session = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        assert await page.text_content("#state") == "Listening"
        record = llm.sessions[0]

        async def heard_it_all():
            return len(b"".join(d for _, d in record.audio_in)) >= len(fed)

        await wait_until(heard_it_all, len(fed) / 32000 + 3, "the whole WAV to reach the server")
        step = 24000 * 2 // 25  # 40 ms chunks, as Gemini sends them
        session.push(
            double.input_transcript("Hello there,"),
            double.input_transcript(" can you hear me?"),
            double.output_transcript("Yes,"),
            *[double.audio(reply[i : i + step]) for i in range(0, len(reply), step)],
            double.output_transcript(" I hear you."),
            double.generation_complete(),
            double.turn_complete(),
        )
        # The page says who is speaking, renders both sides' final text and the turn end.
        await page.wait_for_function(
            "document.getElementById('state').textContent.startsWith('Agent speaking')", timeout=3000
        )
        you = page.locator("#log li[data-side=you][data-final] .text")
        agent = page.locator("#log li[data-side=agent][data-final] .text")
        await you.first.wait_for(timeout=3000)
        assert await you.all_text_contents() == ["Hello there, can you hear me?"]
        # The reply's final waits with its turn end for a late tail (late-tails.js): both come together.
        await agent.first.wait_for(timeout=3000)
        assert await agent.all_text_contents() == ["Yes, I hear you."]
        await page.locator("#log li.turn-end").first.wait_for(timeout=3000)
        [turn_end] = await page.locator("#log li.turn-end").all_text_contents()
        assert turn_end.startswith("turn complete")

        # The reply is played out in full, then the page listens again.
        async def played_all():
            s = await stats(page)
            return s if s["samplesPlayed"] >= len(reply) // 2 and not s["playing"] else None

        final = await wait_until(played_all, len(reply) / 48000 + 2, "the reply to play out")
        assert final["samplesReceived"] == len(reply) // 2
        assert final["samplesFlushed"] == 0
        await page.wait_for_function(
            "document.getElementById('state').textContent === 'Listening'", timeout=2000
        )
        sent = await stats(page)
        assert page.errors == []

    # What the page captured reached the model as 16 kHz speech, frame by frame.
    received = b"".join(d for _, d in record.audio_in)
    assert sent["framesSent"] > 0
    assert sent["bytesSent"] == 640 * sent["framesSent"]  # 20 ms frames of 16 kHz PCM16
    # Frames that waited for the model may reach it joined, never split.
    assert all(len(d) % 640 == 0 for _, d in record.audio_in)
    assert sent["captureRate"] == 16000
    match = speech_found(fed, received)
    print(f"browser capture: {match.found}/{match.speech_blocks} speech blocks found "
          f"({match.fraction:.0%}), whole-signal correlation {match.correlation:.2f}")
    assert match.speech_blocks > 50
    assert match.fraction >= 0.7  # measured 0.84-0.95 here; unrelated speech scores 0.1-0.4


async def meter(page, side: str) -> float:
    return await page.evaluate(f"document.getElementById('level-{side}').value")


async def test_the_page_meters_both_voices_and_shows_how_long_the_reply_took(tmp_path):
    wav, fed = speech_wav(tmp_path)
    reply = speak("Yes, I hear you.", rate=24000)
    llm, session = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        assert await meter(page, "agent") == 0
        # While the microphone hears speech, the "You" meter moves.
        async def you_loud():
            return await meter(page, "you") > 0.5
        await wait_until(you_loud, len(fed) / 32000 + 3, "the microphone meter to move", step=0.02)
        record = llm.sessions[0]

        async def heard_it_all():
            return len(b"".join(d for _, d in record.audio_in)) >= len(fed)

        await wait_until(heard_it_all, len(fed) / 32000 + 3, "the whole WAV to reach the server")
        # The WAV ends with 0.8 s of silence; the model answers 0.5 s after all of it arrived.
        await anyio.sleep(0.5)
        assert await meter(page, "you") < 0.1  # silence reads as silence
        step = 24000 * 2 // 25
        session.push(
            *[double.audio(reply[i : i + step]) for i in range(0, len(reply), step)],
            double.generation_complete(),
            double.turn_complete(),
        )

        async def agent_loud():
            return await meter(page, "agent") > 0.5
        await wait_until(agent_loud, 3, "the agent's meter to move while it speaks", step=0.02)
        line = page.locator("#log li.turn-end").first
        await line.wait_for(timeout=3000)
        waited = int(await line.get_attribute("data-latency-ms")) / 1000
        # From the end of the user's speech: the 0.8 s of silence, the 0.5 s wait,
        # and the trip to the page (its 100 ms prebuffer is not included).
        assert 1.2 <= waited <= 3.5, waited
        shown = re.search(r"answered (\d+\.\d\d) s after you stopped", await line.text_content() or "")
        assert shown, await line.text_content()
        assert abs(float(shown.group(1)) - waited) < 0.006  # the same wait, rounded by the page
        assert page.errors == []


async def test_an_interruption_empties_the_playback_queue_at_once(tmp_path):
    wav, _ = speech_wav(tmp_path)
    long_reply = speak("This is a long answer that goes on and on. " * 4, rate=24000)
    assert len(long_reply) > 2 * 24000 * 6  # several seconds
    llm, session = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        step = 24000 * 2 // 25
        session.push(
            double.output_transcript("This is a long answer"),
            *[double.audio(long_reply[i : i + step]) for i in range(0, len(long_reply), step)],
        )

        async def playing_with_backlog():
            s = await stats(page)
            return s if s["samplesPlayed"] >= 12000 and s["queuedSamples"] >= 48000 else None

        before = await wait_until(playing_with_backlog, 5, "playback with a queue behind it")
        session.push(double.interrupted())
        t0 = time.monotonic()

        async def emptied():
            s = await stats(page)
            return s if s["queuedSamples"] == 0 and not s["playing"] else None

        after = await wait_until(emptied, 1.0, "the playback queue to empty", step=0.01)
        flush_latency = time.monotonic() - t0
        await anyio.sleep(0.5)
        later = await stats(page)
        await page.locator("#log li.turn-end").first.wait_for(timeout=2000)
        assert await page.locator("#log li.turn-end").all_text_contents() == ["interrupted"]
        assert await page.text_content("#state") == "Listening"

    print(f"interruption: queue of {before['queuedSamples'] / 24000:.2f} s emptied in "
          f"{flush_latency * 1000:.0f} ms; {after['samplesFlushed'] / 24000:.2f} s dropped")
    total = len(long_reply) // 2
    assert after["samplesFlushed"] >= 24000  # at least a second of reply was never played
    assert later["samplesPlayed"] == after["samplesPlayed"]  # nothing plays after the flush
    assert later["samplesPlayed"] < total
    assert flush_latency < 0.5


async def test_a_refused_session_is_shown_on_the_page(tmp_path):
    wav, _ = speech_wav(tmp_path)
    llm, _ = scripted()
    async with running(AGENT, llm, token="s3cret") as (_, url), chromium_page(wav) as page:
        await page.goto(http_root(url))
        await page.click("#talk")
        alert = page.locator("#log li.error")
        await alert.first.wait_for(timeout=5000)
        assert (await alert.first.text_content()).startswith("unauthorized:")
        assert await page.text_content("#state") == "Disconnected"
        assert await page.text_content("#talk") == "Start talking"
        # With the token (as ?token=...), the same page connects.
        await page.goto(http_root(url) + "?token=s3cret")
        await press_talk(page)
        assert await page.text_content("#state") == "Listening"
    assert len(llm.sessions) == 1



CAPTURE_AT_44100 = """
async () => {
  const ctx = new OfflineAudioContext(1, 44100, 44100);
  await ctx.audioWorklet.addModule("/client/capture-worklet.js");
  const osc = ctx.createOscillator();
  osc.frequency.value = 440;
  const gain = ctx.createGain();
  gain.gain.value = 1.5;  // past full scale: the worklet must clamp, not wrap
  const node = new AudioWorkletNode(ctx, "live-capture", {
    numberOfInputs: 1, numberOfOutputs: 0, channelCount: 1, channelCountMode: "explicit",
    processorOptions: { targetRate: 16000, frameMs: 20 },
  });
  const frames = [];
  node.port.onmessage = (e) => frames.push(Array.from(new Int16Array(e.data)));
  osc.connect(gain).connect(node);
  osc.start();
  await ctx.startRendering();
  await new Promise((r) => setTimeout(r, 200));
  return frames;
}
"""


async def test_capture_downsamples_44100_to_16000_and_clamps_instead_of_wrapping(tmp_path):
    """Where a browser will not open a 16 kHz context, the worklet converts a
    non-integer ratio (2.75625) itself; loud input saturates at full scale."""
    import numpy as np

    wav, _ = speech_wav(tmp_path)
    llm, _ = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await page.goto(http_root(url))
        frames = await page.evaluate(CAPTURE_AT_44100)
    assert {len(f) for f in frames} == {320}
    x = np.array([s for f in frames for s in f], dtype=np.int64)
    assert abs(len(x) - 16000) <= 320  # one second in, one second out
    assert x.max() == 32767 and x.min() == -32768
    assert np.max(np.abs(np.diff(x))) < 12000  # a wrap at +1.0 would jump by ~65535
    spectrum = np.abs(np.fft.rfft(x[1000:] * np.hanning(len(x) - 1000)))
    peak_hz = np.argmax(spectrum) * 16000 / (len(x) - 1000)
    assert abs(peak_hz - 440) < 3, peak_hz


async def test_the_page_answers_a_client_side_tool_call_from_its_handler_map(tmp_path):
    wav, _ = speech_wav(tmp_path)
    llm, session = scripted()
    session.on_tool_response(double.output_transcript("It is noon."), double.turn_complete())
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        session.push(double.tool_call("get_page_time", {}, id="t-1"))
        await page.locator("#log li.turn-end").first.wait_for(timeout=5000)
        shown = await page.locator("#log li.tool").all_text_contents()
        assert shown == ["⚙ get_page_time({})"]
        assert await page.locator("#log li[data-side=agent] .text").all_text_contents() == ["It is noon."]
    [response] = session.tool_responses[0].function_responses
    assert response.id == "t-1" and response.name == "get_page_time"
    assert set(response.response) == {"iso", "zone"}  # what the demo page's handler returned


async def test_after_a_barge_in_the_page_reports_playback_and_is_told_what_the_user_heard(tmp_path):
    wav, _ = speech_wav(tmp_path)
    long_reply = speak("This is a long answer that goes on and on. " * 4, rate=24000)
    step = 24000 * 2 // 25  # 40 ms chunks, each after the word it speaks
    chunks = [long_reply[i : i + step] for i in range(0, len(long_reply), step)]
    words = [f" w{i}" for i in range(len(chunks))]
    script = []
    for word, chunk in zip(words, chunks, strict=True):
        script += [double.output_transcript(word), double.audio(chunk)]
    llm, session = scripted()
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await start_talking(page, url)
        await page.evaluate(
            "window.heard = []; window.seen = [];"
            "for (const t of ['transcript.output', 'turn.interrupted', 'turn.complete', 'error', 'session.closed'])"
            "  window.live.on(t, (m) => { window.seen.push(m); if (m.heard) window.heard.push(m); });"
        )
        session.push(*script)

        async def playing_a_while():
            s = await stats(page)
            return s if s["samplesPlayed"] >= 24000 and s["queuedSamples"] >= 48000 else None

        await wait_until(playing_a_while, 8, "a second of the reply played, with more queued")
        session.push(double.interrupted(), double.turn_complete())
        try:
            heard = await wait_until(lambda: page.evaluate("window.heard[0] || null"), 5, "what the user heard")
        except AssertionError as exc:
            seen = await page.evaluate("JSON.stringify(window.seen.slice(-6))")
            raise AssertionError(f"{exc}; the page's last events: {seen}; its counters: {await stats(page)}") from None
        await anyio.sleep(0.3)
        after = await stats(page)
        assert page.errors == []
    played = after["samplesPlayed"] / 24000  # the page played nothing more after the flush
    full = "".join(words)
    print(f"heard {heard['played']:.3f} s: {heard['text'][:40]}...; the page played {played:.3f} s")
    assert heard["text"] and full.startswith(heard["text"])  # a prefix of the whole reply
    assert abs(heard["played"] - played) <= 0.2
    assert abs(len(heard["text"].split()) * 0.04 - played) <= 0.2  # the words of the audio played


CAPTURE_TONE = """
async ([rate, hz]) => {
  const ctx = new OfflineAudioContext(1, rate, rate);
  await ctx.audioWorklet.addModule("/client/capture-worklet.js");
  const osc = ctx.createOscillator();
  osc.frequency.value = hz;
  const gain = ctx.createGain();
  gain.gain.value = 0.5;
  const node = new AudioWorkletNode(ctx, "live-capture", {
    numberOfInputs: 1, numberOfOutputs: 0, channelCount: 1, channelCountMode: "explicit",
    processorOptions: { targetRate: 16000, frameMs: 20 },
  });
  const frames = [];
  node.port.onmessage = (e) => frames.push(Array.from(new Int16Array(e.data)));
  osc.connect(gain).connect(node);
  osc.start();
  await ctx.startRendering();
  await new Promise((r) => setTimeout(r, 200));
  return frames.flat();
}
"""

PLAYBACK_TONE = """
async ([rate, hz]) => {
  const ctx = new OfflineAudioContext(1, rate, rate);
  await ctx.audioWorklet.addModule("/client/playback-worklet.js");
  const node = new AudioWorkletNode(ctx, "live-playback", {
    numberOfInputs: 0, numberOfOutputs: 1, outputChannelCount: [1],
    processorOptions: { prebufferMs: 100 },
  });
  const pcm = new Int16Array(24000);
  for (let i = 0; i < pcm.length; i++) pcm[i] = Math.round(16000 * Math.sin(2 * Math.PI * hz * i / 24000));
  node.port.postMessage(pcm.buffer, [pcm.buffer]);
  node.port.postMessage({ type: "end" });
  node.connect(ctx.destination);
  await new Promise((r) => setTimeout(r, 100));
  const rendered = await ctx.startRendering();
  return Array.from(rendered.getChannelData(0));
}
"""


def _rms(x) -> float:
    import numpy as np

    return float(np.sqrt(np.mean(np.square(np.asarray(x, dtype=np.float64)))))


async def test_capture_at_a_devices_rate_removes_what_16_khz_cannot_carry(tmp_path):
    """A tone above 8 kHz must not fold back into the speech band (at 16000 - f):
    at least 40 dB down, while speech frequencies pass whole."""
    import math

    wav, _ = speech_wav(tmp_path)
    llm, _ = scripted()
    levels = {}
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await page.goto(http_root(url))
        for rate in (44100, 48000):
            for hz in (1000, 9000, 10000):
                out = (await page.evaluate(CAPTURE_TONE, [rate, hz]))[1600:]
                levels[rate, hz] = 20 * math.log10(max(_rms(out), 1e-9) / (0.5 * 32767 / math.sqrt(2)))
    print("capture worklet:", ", ".join(f"{r} Hz in, {hz} Hz tone: {db:.0f} dB" for (r, hz), db in levels.items()))
    for (rate, hz), db in levels.items():
        if hz == 1000:
            assert abs(db) < 0.5, (rate, db)
        else:
            assert db <= -40, (rate, hz, db)


async def test_playback_at_a_devices_rate_has_no_mirror_images(tmp_path):
    """24 kHz reply audio played at 44.1/48 kHz: a 10 kHz tone must not bring its
    image at 24000 - 10000 = 14 kHz (at least 40 dB below the tone)."""
    import numpy as np

    wav, _ = speech_wav(tmp_path)
    llm, _ = scripted()
    levels = {}
    async with running(AGENT, llm) as (_, url), chromium_page(wav) as page:
        await page.goto(http_root(url))
        for rate in (44100, 48000):
            out = np.asarray(await page.evaluate(PLAYBACK_TONE, [rate, 10000]))
            out = out[rate // 5 : rate - rate // 10]  # past the prebuffer, before the end
            assert _rms(out) > 0.1  # it played
            spectrum = np.abs(np.fft.rfft(out * np.hanning(len(out))))
            freqs = np.fft.rfftfreq(len(out), 1 / rate)
            tone = spectrum[np.abs(freqs - 10000) < 200].max()
            image = spectrum[np.abs(freqs - 14000) < 200].max()
            levels[rate] = 20 * np.log10(image / tone)
    print("playback worklet:", ", ".join(f"at {r} Hz the 14 kHz image is {db:.0f} dB" for r, db in levels.items()))
    assert all(db <= -40 for db in levels.values()), levels


async def test_the_page_reattaches_after_its_socket_drops_and_misses_no_event(tmp_path):
    wav, _ = speech_wav(tmp_path)
    llm, session = scripted()
    async with running(AGENT, llm) as (server, url), chromium_page(wav) as page:
        await start_talking(page, url)
        await page.evaluate(
            "window.reattach = []; "
            "window.live.on('reattaching', (e) => window.reattach.push('reattaching'));"
            "window.live.on('session.reattached', (e) => window.reattach.push('reattached:' + e.replayed));"
            "window.said = []; window.live.on('transcript.output', (e) => window.said.push(e.text)); 0"
        )
        [live] = list(server.live_sessions.values())
        live.ws.transport.abort()  # the page's network goes away: no close frame
        session.push(double.output_transcript("while you were away"))  # said during the gap
        await wait_until(
            lambda: page.evaluate("window.reattach.some((x) => x.startsWith('reattached'))"),
            10, "the page to reattach",
        )
        assert await page.evaluate("window.reattach[0]") == "reattaching"
        session.push(double.output_transcript("and after"), double.turn_complete())
        # Every frame of the stream reached the page once: the one said while it was
        # away (replayed), then the rest; its count is the server's last number.
        await wait_until(
            lambda: page.evaluate(f"window.live._lastSeq === {4}"), 10, "the page to receive every frame",
        )
        assert live.client.replay.last_seq == 4
        assert await page.evaluate("window.reattach") == ["reattaching", "reattached:1"]
        assert await page.evaluate("window.live.state.connection") == "open"
        assert "reattach" in await page.text_content("#log")
        said = await page.evaluate("window.said")
        assert said.count("while you were away") == 1 and "and after" in said  # nothing missed or doubled
    assert len(llm.sessions) == 1  # the same model session throughout


async def test_after_a_replay_that_lost_frames_the_page_counts_them_and_takes_the_new_token(tmp_path):
    """Audio the server no longer kept (`missed`) is numbered all the same: a page
    that did not count it would have the next drop replay what was already heard."""
    wav, _ = speech_wav(tmp_path)
    llm, session = scripted()
    async with running(AGENT, llm, reattach_audio_seconds=0.1) as (server, url), chromium_page(wav) as page:
        await start_talking(page, url)
        await page.evaluate(
            "window.reattached = null; window.live.on('session.reattached', (e) => { window.reattached = e; }); 0"
        )
        first_token = await page.evaluate("window.live.session.resume_token")
        [live] = list(server.live_sessions.values())
        replay = live.client.replay
        before = replay.last_seq
        live.ws.transport.abort()  # the page's network goes away: no close frame
        for _ in range(20):  # 0.4 s of reply while it is away, 0.1 s of it kept
            session.push(double.audio(b"\x01\x00" * 480))
            await anyio.sleep(0.02)
        with anyio.fail_after(5):  # the reply is sent while the page is away
            while replay.last_seq < before + 20:
                await anyio.sleep(0.02)
        await wait_until(lambda: page.evaluate("window.reattached !== null"), 10, "the page to reattach")
        news = await page.evaluate("window.reattached")
        assert news["missed"] > 0 and news["replayed"] > 0
        await wait_until(
            lambda: page.evaluate(f"window.live._lastSeq === {replay.last_seq}"), 5, "the page to count every frame",
        )
        token = await page.evaluate("window.live.session.resume_token")
        assert token and token != first_token and token == news["resume_token"]


async def test_on_a_server_that_requires_tokens_the_page_reattaches_with_its_token(tmp_path):
    """A resume is authorized like a start: the page sends its token along."""
    from live.access.auth import mint_token

    secret = "a-test-secret-that-is-long-enough-for-hs256"
    wav, _ = speech_wav(tmp_path)
    llm, _ = scripted()
    async with running(AGENT, llm, token_secret=secret) as (server, url), chromium_page(wav) as page:
        await page.goto(http_root(url) + "?token=" + mint_token(secret, subject="ann", ttl=60))
        await press_talk(page)
        await page.evaluate(
            "window.reattached = null; window.live.on('session.reattached', (e) => { window.reattached = e; }); 0"
        )
        [live] = list(server.live_sessions.values())
        live.ws.transport.abort()  # the page's network goes away: no close frame
        await wait_until(lambda: page.evaluate("window.reattached !== null"), 10, "the page to reattach")
        assert await page.evaluate("window.live.state.connection") == "open"
        assert list(server.live_sessions.values()) == [live]  # the same conversation
