"""What a `local/voice` session costs: real-time factor, CPU, memory, latency, word error rate.

    python -m bench.local_voice                  # 1, 4 and 8 concurrent sessions; about 2 minutes
    python -m bench.local_voice --sessions 1,16 --turns 4 --skip-wer

Speech is made with the same eSpeak NG library the model speaks with (en-us,
140 words a minute), so the bench needs nothing from the system. Three parts:

1. **Word error rate** of the final input transcripts on a fixed list of
   sentences: everyday ones (the general English model) and weather questions
   (the vocabulary biased to the weather sample's tools).
2. **Latency**, one session fed in real time: from the end of the user's speech
   to the final input transcript, and to the first reply audio.
3. **Cost**, N sessions of the weather agent at once, each fed `--turns`
   spoken questions (7 s of silence after each, for the spoken answer) in
   real time, 20 ms frames as a microphone sends them: the process's CPU seconds
   per second of audio heard (the real-time factor; 1.0 would be a whole
   core per live session), the same per session-minute, the growth of the
   resident set per session, and the longest the event loop was kept waiting.
   Synthesis is timed on its own (CPU seconds per second of speech made).
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import time

import anyio
from google.genai import types

from connections.audio import resample_pcm16
from connections.local_voice import LocalVoice, VoiceConfig, word_error_rate
from connections.local_voice.speech import synthesize
from live.agent import Agent
from samples import weather

EVERYDAY = [
    "I like green apples and bananas.",
    "Hello, can you hear me?",
    "Tell me a story about a dragon.",
    "I would like to book a table for two.",
    "Please call my mother tomorrow morning.",
    "It is a beautiful day in the neighborhood.",
]
WEATHER = [
    "What is the weather in Paris?",
    "How is the weather in Tokyo today?",
    "Tell me the forecast for Lisbon.",
    "What is the weather like in Sao Paulo?",
    "What is the forecast for Nairobi for the next two days?",
    "Weather in Reykjavik.",
]
PLAIN = Agent(name="plain", model="local/voice")
AGENT = weather.agent.with_model("local/voice")
MIME = "audio/pcm;rate=16000"
FRAME = 640


def spoken(text: str) -> bytes:
    return resample_pcm16(synthesize(text, voice="en-us", wpm=140).audio, 24000, 16000)


def silence(seconds: float) -> bytes:
    return bytes(2 * int(16000 * seconds))


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def answer_tools(conn, response) -> None:  # type: ignore[no-untyped-def]
    for call in response.function_calls:
        tool = AGENT.tools_by_name[call.name]
        result = tool(**(call.args or {}))
        part = types.Part(function_response=types.FunctionResponse(id=call.id, name=call.name, response=result))
        await conn.send_content(types.Content(role="user", parts=[part]))


async def one_turn(llm: LocalVoice, agent: Agent, said: str, *, real_time: bool) -> dict:
    """Speak `said` into a fresh session; returns what was heard and when."""
    pcm = silence(0.3) + spoken(said)
    tail = silence(1.5)
    out: dict = {}
    async with llm.connect(agent.request()) as conn:
        async def feed() -> None:
            for start in range(0, len(pcm + tail), FRAME):
                if start == len(pcm) // FRAME * FRAME:
                    out["speech_end"] = time.perf_counter()
                await conn.send_realtime(types.Blob(data=(pcm + tail)[start : start + FRAME], mime_type=MIME))
                if real_time:
                    await anyio.sleep(0.02)

        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            async for response in conn.receive():
                t = response.input_transcription
                if t is not None and t.finished:
                    out["heard"], out["final_at"] = t.text or "", time.perf_counter()
                if response.audio_chunks and "audio_at" not in out:
                    out["audio_at"] = time.perf_counter()
                await answer_tools(conn, response)
                if response.turn_complete or response.interrupted:
                    break
            tg.cancel_scope.cancel()
    return out


async def word_errors(llm: LocalVoice) -> None:
    print("word error rate (final input transcripts; espeak en-us at 140 wpm):")
    for label, agent, sentences in (("everyday", PLAIN, EVERYDAY), ("weather", AGENT, WEATHER)):
        rates = []
        for said in sentences:
            heard = (await one_turn(llm, agent, said, real_time=False)).get("heard", "")
            rates.append(word_error_rate(said, heard))
            print(f"  {rates[-1]:4.2f}  {said!r} -> {heard!r}")
        print(f"  mean {label}: {statistics.mean(rates):.2f}")


async def latency(llm: LocalVoice) -> None:
    finals, audios = [], []
    for said in WEATHER[:3] + EVERYDAY[:3]:
        agent = AGENT if said in WEATHER else PLAIN
        r = await one_turn(llm, agent, said, real_time=True)
        finals.append(r["final_at"] - r["speech_end"])
        audios.append(r["audio_at"] - r["speech_end"])
    print(
        "latency after the end of speech, fed in real time (includes the 0.64 s of silence "
        f"that ends a turn): final transcript median {statistics.median(finals):.2f} s "
        f"(max {max(finals):.2f}), first reply audio median {statistics.median(audios):.2f} s "
        f"(max {max(audios):.2f})"
    )


async def cost(llm: LocalVoice, sessions: int, turns: int) -> None:
    questions = [spoken(q) for q in WEATHER]
    conversation = b"".join(silence(0.3) + questions[i % len(questions)] + silence(7.0) for i in range(turns))
    audio_s = len(conversation) / 32000
    lag = 0.0
    done = anyio.Event()

    async def ticker() -> None:
        nonlocal lag
        while not done.is_set():
            t = anyio.current_time()
            await anyio.sleep(0.01)
            lag = max(lag, anyio.current_time() - t - 0.01)

    async def session(opened: list[int]) -> None:
        async with llm.connect(AGENT.request()) as conn:
            opened.append(1)
            answered = 0

            async def feed() -> None:  # a microphone: a 20 ms frame every 20 ms
                t0 = anyio.current_time()
                for k, start in enumerate(range(0, len(conversation), FRAME)):
                    await anyio.sleep_until(t0 + 0.02 * k)
                    await conn.send_realtime(types.Blob(data=conversation[start : start + FRAME], mime_type=MIME))

            async with anyio.create_task_group() as tg:
                tg.start_soon(feed)
                async for response in conn.receive():
                    await answer_tools(conn, response)
                    if response.turn_complete or response.interrupted:
                        answered += 1
                        if answered == turns:
                            break
                tg.cancel_scope.cancel()

    cpu0, t0 = cpu_s(), time.perf_counter()
    opened: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        async with anyio.create_task_group() as sessions_tg:
            for _ in range(sessions):
                sessions_tg.start_soon(session, opened)
        done.set()
    cpu, wall = cpu_s() - cpu0, time.perf_counter() - t0
    rtf = cpu / (audio_s * sessions)
    print(
        f"  {sessions:2d} sessions x {audio_s:.1f} s of audio ({turns} questions each): "
        f"real-time factor {rtf:.3f} CPU s per audio s = {60 * rtf:.1f} CPU s per session-minute; "
        f"wall {wall:.1f} s; "
        f"event loop waited at most {lag * 1000:.0f} ms"
    )


async def loop_lag(seconds: float) -> float:
    """The longest a 10 ms sleep overran with nothing else in this process:
    the machine's own noise, to read the figures under load against."""
    lag, end = 0.0, anyio.current_time() + seconds
    while anyio.current_time() < end:
        t = anyio.current_time()
        await anyio.sleep(0.01)
        lag = max(lag, anyio.current_time() - t - 0.01)
    return lag


async def memory(llm: LocalVoice, sessions: int) -> None:
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(llm.connect(AGENT.request()))
        rss0 = rss_mib()
        for _ in range(sessions):
            await stack.enter_async_context(llm.connect(AGENT.request()))
        grown = rss_mib() - rss0
    print(f"memory: {sessions} more open sessions grew the process by {grown:.1f} MiB "
          f"({1024 * grown / sessions:.0f} KiB each)")


def synthesis_cost() -> None:
    text = "get weather: city Paris, sky overcast, temperature 12 degrees, humidity 78 percent."
    synthesize(text)
    cpu0 = cpu_s()
    seconds = 0.0
    for _ in range(10):
        seconds += len(synthesize(text).audio) / 48000
    print(f"synthesis: {(cpu_s() - cpu0) / seconds:.3f} CPU s per second of speech (24 kHz, resampled)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="1,4,8", help="comma-separated session counts")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--skip-wer", action="store_true")
    args = parser.parse_args()

    rss_start = rss_mib()
    llm = LocalVoice(config=VoiceConfig(speed=50.0))
    t0, cpu0 = time.perf_counter(), cpu_s()
    async with llm.connect(AGENT.request()):
        pass
    print(
        f"first session: opened in {time.perf_counter() - t0:.2f} s ({cpu_s() - cpu0:.2f} CPU s: "
        f"the general English model loads once per process); process RSS {rss_start:.0f} -> "
        f"{rss_mib():.0f} MiB; {llm.config.threads} worker threads"
    )
    t0 = time.perf_counter()
    async with llm.connect(AGENT.request()):
        pass
    print(f"next sessions open in {1000 * (time.perf_counter() - t0):.0f} ms")
    await memory(llm, 20)
    synthesis_cost()
    if not args.skip_wer:
        await word_errors(llm)
    await latency(LocalVoice())
    idle_lag = await loop_lag(3.0)
    print(f"cost, N sessions at once (weather agent, fed in real time; an idle event loop "
          f"here overran a 10 ms sleep by up to {idle_lag * 1000:.0f} ms):")
    live = LocalVoice()
    async with live.connect(AGENT.request()):
        pass  # loads the general model before the clock starts
    for n in (int(x) for x in args.sessions.split(",")):
        await cost(live, n, args.turns)


if __name__ == "__main__":
    anyio.run(main)
