"""Does `local/voice` hear what the docs tell people to say? Word error rate, biasing off and on.

    python -m bench.local_voice_wer                 # about 3 minutes on 2 cores
    python -m bench.local_voice_wer --voices en     # one voice

Each sentence the README and the docs give as something to say to the weather
sample (and two free sentences to the plain agent, which no tool words should
bend) is spoken by espeak-ng (the command-line program, as users' test audio
would be made) in each voice at 160 words a minute (as `tests/audio_fixtures.speak` does), and heard
through a fresh `local/voice` session:

- at 16 kHz, as `/live` and `live mic` send it;
- as a phone call: resampled to 8 kHz, G.711 μ-law encoded and decoded, and
  resampled back to 16 kHz frame by frame with `live.phone.audio`, as the
  carrier doors do.

Each twice: **off** is PocketSphinx's general English model alone
(`VoiceConfig(bias=False)`, no phone-band fill), **on** is the default (the
agent's vocabulary, the slot grammar, the phone-band fill). Printed: each
transcript, then a table of the mean word error rate and of the tool calls
made with the right city, per voice and rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import anyio
from google.genai import types

from connections.local_voice import ListenConfig, LocalVoice, VoiceConfig, word_error_rate
from live.agent import Agent
from live.phone.audio import Resampler, ulaw_decode, ulaw_encode
from samples import weather

WEATHER_AGENT = weather.agent.with_model("local/voice")
PLAIN_AGENT = Agent(name="plain", model="local/voice")


@dataclasses.dataclass(frozen=True)
class Sentence:
    text: str
    where: str
    city: str | None = None
    """The city the call should name (None: a free sentence, no call)."""


SENTENCES = [
    Sentence("What is the weather in Paris?", "README, quickstart, local-voice", "Paris"),
    Sentence("What's the weather in Lisbon?", "clients, quickstart, protocol", "Lisbon"),
    Sentence("Weather in Lisbon?", "testing", "Lisbon"),
    Sentence("What is the weather in Sao Paulo?", "local-voice", "Sao Paulo"),
    Sentence("Tell me the forecast for Tokyo for the next two days.", "local-voice, tests", "Tokyo"),
    Sentence("I like green apples and bananas.", "free speech (plain agent)"),
    Sentence("Hello, can you hear me?", "free speech (plain agent)"),
]
VOICES = ("en", "en-us+f3")
FRAME = 640  # 20 ms at 16 kHz


def espeak(text: str, voice: str) -> bytes:
    """`text` as 16 kHz PCM16, spoken by the espeak-ng program and converted by sox."""
    if not (shutil.which("espeak-ng") and shutil.which("sox")):
        raise SystemExit("this benchmark needs espeak-ng and sox (apt-get install espeak-ng sox)")
    with tempfile.TemporaryDirectory() as tmp:
        wav, raw = Path(tmp) / "s.wav", Path(tmp) / "s.raw"
        subprocess.run(["espeak-ng", "-v", voice, "-s", "160", "-w", str(wav), text], check=True, capture_output=True)
        subprocess.run(
            ["sox", str(wav), "-t", "raw", "-r", "16000", "-c", "1", "-b", "16", "-e", "signed-integer", "-L", str(raw)],
            check=True, capture_output=True,
        )
        return raw.read_bytes()


def phone_call(pcm16k: bytes) -> bytes:
    """What a carrier door gives the session of this speech: 8 kHz μ-law and back, 20 ms at a time."""
    down = Resampler(16_000, 8_000)
    ulaw = ulaw_encode(down(pcm16k) + down.flush())
    up = Resampler(8_000, 16_000)
    return b"".join(up(ulaw_decode(ulaw[i : i + 160])) for i in range(0, len(ulaw), 160))


async def hear(llm: LocalVoice, agent: Agent, pcm: bytes) -> tuple[str, list[tuple[str, dict]]]:
    """The final input transcript of one spoken turn, and the tool calls it made."""
    audio = bytes(9_600) + pcm + bytes(48_000)
    heard, calls = "", []
    async with llm.connect(agent.request()) as conn:
        async def feed() -> None:
            for i in range(0, len(audio), FRAME):
                await conn.send_realtime(types.Blob(data=audio[i : i + FRAME], mime_type="audio/pcm;rate=16000"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            async for response in conn.receive():
                t = response.input_transcription
                if t is not None and t.finished:
                    heard = t.text or ""
                for call in response.function_calls:
                    calls.append((call.name or "", dict(call.args or {})))
                    result = agent.tools_by_name[call.name](**(call.args or {}))
                    answer = types.FunctionResponse(id=call.id, name=call.name, response=result)
                    await conn.send_content(types.Content(role="user", parts=[types.Part(function_response=answer)]))
                if response.turn_complete or response.interrupted:
                    break
            tg.cancel_scope.cancel()
    return heard, calls


def right_call(sentence: Sentence, calls: list[tuple[str, dict]]) -> bool:
    if sentence.city is None:
        return not calls
    return len(calls) == 1 and calls[0][1].get("city") == sentence.city


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--voices", default=",".join(VOICES), help="comma-separated espeak-ng voices")
    args = parser.parse_args()
    voices = args.voices.split(",")
    models = {
        "off": LocalVoice(config=VoiceConfig(speed=50.0, bias=False, listen=ListenConfig(phone_image=0.0))),
        "on": LocalVoice(config=VoiceConfig(speed=50.0)),
    }
    # (voice, rate, bias) -> [(wer, right call)]
    scores: dict[tuple[str, str, str], list[tuple[float, bool]]] = {}
    for voice in voices:
        for sentence in SENTENCES:
            wide = espeak(sentence.text, voice)
            agent = WEATHER_AGENT if sentence.city else PLAIN_AGENT
            for rate, pcm in (("16 kHz", wide), ("8 kHz call", phone_call(wide))):
                for bias, llm in models.items():
                    heard, calls = await hear(llm, agent, pcm)
                    wer, right = word_error_rate(sentence.text, heard), right_call(sentence, calls)
                    scores.setdefault((voice, rate, bias), []).append((wer, right))
                    call = ", ".join(f"{n}({a})" for n, a in calls) or "no call"
                    print(f"{voice:9s} {rate:10s} {bias:3s} {wer:4.2f} {'ok ' if right else 'BAD'} "
                          f"{sentence.text!r} -> {heard!r}; {call}", flush=True)
    print()
    print("| voice | audio | word error rate, off → on | right tool call (or none), off → on |")
    print("|---|---|---|---|")
    for voice in voices:
        for rate in ("16 kHz", "8 kHz call"):
            off, on = scores[(voice, rate, "off")], scores[(voice, rate, "on")]
            n = len(on)
            print(
                f"| `{voice}` | {rate} | {statistics.mean(w for w, _ in off):.2f} → "
                f"{statistics.mean(w for w, _ in on):.2f} | {sum(r for _, r in off)}/{n} → {sum(r for _, r in on)}/{n} |"
            )


if __name__ == "__main__":
    anyio.run(main)
