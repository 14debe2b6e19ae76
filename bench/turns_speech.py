"""The spoken test set of the turn-taking benchmark, made here (`bench.turns`).

    python -m bench.turns_speech          # make (or check) the set, print what it holds

Synthetic voices, so anyone can make the same set on a Debian machine with
`espeak-ng`, `festival` (with `festvox-us-slt-hts`, `festvox-kallpc16k`) and
`flite` installed (`sudo apt-get install espeak-ng festival festvox-us-slt-hts
festvox-kallpc16k flite` on Debian):

- sentences with a natural place to pause ("I'd like to book a flight to |
  Boston next Friday morning."), each spoken whole, as one utterance, so the
  words before the pause keep the prosody of a sentence that goes on; the
  pause is silence put in at that word boundary afterwards (espeak-ng speaks
  an SSML break there, festival and flite say where each word ends);
- backchannels ("mm-hm", "uh-huh", "yeah", "right", "okay", "I see"), spoken
  quickly, as people say them over someone else;
- interruptions ("Wait, stop, I meant Tuesday.");
- noise bursts made with numpy (a cough, clicks, a knock, a door), and
  backgrounds: white and pink noise, and babble (four voices at once saying
  other sentences).

Everything is 16 kHz mono float32 in [-1, 1], speech normalised to the same
active level (-20 dBFS). Made once and kept in bench/results/turns-set/.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np
import soxr

__all__ = ["RATE", "SpokenSet", "Utterance", "load", "mix_at_snr"]

RATE = 16_000
LEVEL_DBFS = -20.0
ROOT = Path(__file__).resolve().parent / "results" / "turns-set"

SENTENCES = [
    ("I'd like to book a flight to", "Boston next Friday morning."),
    ("Can you tell me what the weather will be like in", "Paris tomorrow?"),
    ("My account number is four five six", "seven eight nine."),
    ("I was wondering if you could help me with", "my internet connection."),
    ("The problem started when I tried to", "log in this morning."),
    ("Please send the invoice to", "my work email address."),
    ("I need to change the delivery address because", "I moved last week."),
    ("Could you remind me to call", "my mother at six?"),
    ("What I really want to know is", "how much it costs."),
    ("So the thing is, um,", "I don't have the receipt anymore."),
    ("I think the best option would be the", "blue one."),
    ("Let me check, the code on the card is", "three one two."),
    ("We are planning a trip for", "about ten people in June."),
    ("Yes, and also I wanted to ask about", "the refund policy."),
    ("Can I speak to someone in", "the billing department?"),
    ("I'm calling because my order from", "last Tuesday never arrived."),
]
BACKCHANNELS = ["mm-hm", "uh-huh", "yeah", "right", "okay", "I see"]
INTERRUPTIONS = [
    "Wait, stop, I meant Tuesday, not Monday.",
    "Sorry, can I change that to the afternoon instead?",
    "Hold on, that is not what I asked for.",
    "No, no, the other account, the savings one.",
]
BABBLE = [
    "The quarterly numbers look better than we expected this year.",
    "Did you see the game last night, it went to overtime.",
    "We should paint the kitchen before the guests arrive.",
    "My brother is moving to the coast in the spring.",
]
# (engine, voice, words per minute for espeak-ng)
VOICES = [
    ("espeak", "en-us", 150),
    ("espeak", "en-gb", 155),
    ("espeak", "en-us+f3", 145),
    ("festival", "cmu_us_slt_arctic_hts", 0),
    ("festival", "kal_diphone", 0),
    ("flite", "slt", 0),
    ("flite", "awb", 0),
]


@dataclasses.dataclass
class Utterance:
    """One sentence: `head` and `tail` are its two parts, spoken as one; the
    pause goes at `split` (a sample index between them)."""

    voice: str
    text: str
    audio: np.ndarray
    split: int

    def with_pause(self, seconds: float) -> np.ndarray:
        """The sentence with a pause of `seconds` at its split (10 ms fades either side)."""
        fade = np.linspace(1.0, 0.0, 160, dtype=np.float32)
        head, tail = self.audio[: self.split].copy(), self.audio[self.split :].copy()
        head[-160:] *= fade[-head[-160:].size :]
        tail[:160] *= fade[::-1][: tail[:160].size]
        gap = np.zeros(int(seconds * RATE), np.float32)
        return np.concatenate((head, gap, tail))


@dataclasses.dataclass
class SpokenSet:
    sentences: dict[str, list[Utterance]]  # by voice
    backchannels: dict[str, list[np.ndarray]]
    interruptions: dict[str, list[np.ndarray]]
    babble: np.ndarray
    bursts: dict[str, np.ndarray]

    @property
    def voices(self) -> list[str]:
        return list(self.sentences)


# ---------------------------------------------------------------------------- synthesis


def _read_wav(path: str) -> np.ndarray:
    with wave.open(path) as w:
        rate = w.getframerate()
        x = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768
    return soxr.resample(x, rate, RATE).astype(np.float32) if rate != RATE else x


def _trim(x: np.ndarray, threshold: float = 2e-3) -> tuple[np.ndarray, int]:
    """Leading and trailing silence cut off; returns the audio and how much was cut in front."""
    loud = np.flatnonzero(np.abs(x) > threshold)
    if not loud.size:
        return x, 0
    start, end = max(0, loud[0] - 80), min(x.size, loud[-1] + 160)
    return x[start:end], start


def _normalise(x: np.ndarray) -> np.ndarray:
    """To LEVEL_DBFS over its active part (frames within 30 dB of its loudest)."""
    frames = x[: x.size // 320 * 320].reshape(-1, 320)
    power = (frames**2).mean(axis=1)
    active = power[power > power.max() * 1e-3] if power.size else power
    level = np.sqrt(active.mean()) if active.size else 1.0
    return (x * (10 ** (LEVEL_DBFS / 20) / max(level, 1e-6))).astype(np.float32)


def _espeak(text: str, voice: str, wpm: int, ssml: bool = False) -> np.ndarray:
    with tempfile.NamedTemporaryFile(suffix=".wav") as f:
        args = ["espeak-ng", "-v", voice, "-s", str(wpm), "-w", f.name]
        subprocess.run([*args, "-m", text] if ssml else [*args, text], check=True, capture_output=True)
        return _read_wav(f.name)


def _longest_gap(x: np.ndarray, threshold: float = 2e-3) -> tuple[int, int]:
    hop = 160
    n = x.size // hop
    voiced = np.sqrt((x[: n * hop].reshape(n, hop) ** 2).mean(axis=1)) > threshold
    idx = np.flatnonzero(voiced)
    best, best_at, run, run_at = 0, 0, 0, 0
    for i in range(idx[0], idx[-1]):
        if voiced[i]:
            run = 0
            continue
        if run == 0:
            run_at = i
        run += 1
        if run > best:
            best, best_at = run, run_at
    return best_at * hop, (best_at + best) * hop


def _espeak_sentence(head: str, tail: str, voice: str, wpm: int) -> tuple[np.ndarray, int]:
    """Spoken with a long SSML break between the parts; the break is taken out again."""
    x = _espeak(f'<speak>{head} <break time="1500ms"/> {tail}</speak>', voice, wpm, ssml=True)
    x, _ = _trim(x)
    start, end = _longest_gap(x)
    return np.concatenate((x[: start + 400], x[end - 400 :])), start + 400


def _festival_sentence(head: str, tail: str, voice: str) -> tuple[np.ndarray, int]:
    """Spoken whole; festival says where each word ends, so the pause goes after the head's last."""
    text = f"{head} {tail}".replace('"', "")
    with tempfile.TemporaryDirectory() as tmp:
        wav = f"{tmp}/s.wav"
        scheme = (
            f"(voice_{voice})\n"
            f'(set! utt (utt.synth (eval (list \'Utterance \'Text "{text}"))))\n'
            f'(utt.save.wave utt "{wav}" \'riff)\n'
            "(mapcar (lambda (tok) (format t \"T %s %f\\n\" (item.name tok) (item.feat tok \"daughtern.word_end\")))"
            " (utt.relation.items utt 'Token))\n"
        )
        Path(f"{tmp}/s.scm").write_text(scheme)
        out = subprocess.run(["festival", "-b", f"{tmp}/s.scm"], capture_output=True, text=True, check=True).stdout
        x = _read_wav(wav)
    ends = [float(line.split()[2]) for line in out.splitlines() if line.startswith("T ")]
    split = int(ends[len(head.split()) - 1] * RATE) + 160
    x, cut = _trim(x)
    return x, split - cut


def _flite(text: str, voice: str) -> tuple[np.ndarray, list[tuple[str, float]]]:
    with tempfile.NamedTemporaryFile(suffix=".wav") as f:
        out = subprocess.run(
            ["flite", "-voice", voice, "-psdur", "-t", text, "-o", f.name], capture_output=True, text=True, check=True
        ).stdout
        segments = [(s.rsplit(":", 1)[0], float(s.rsplit(":", 1)[1])) for s in out.split() if ":" in s]
        return _read_wav(f.name), segments


def _flite_sentence(head: str, tail: str, voice: str) -> tuple[np.ndarray, int]:
    """Spoken whole; the head's phones, spoken alone, say how many of the
    sentence's phones are the head's: the pause goes after the last of them."""
    x, segments = _flite(f"{head} {tail}", voice)
    _, head_segments = _flite(head, voice)
    phones = len([s for s in head_segments if s[0] != "pau"])
    spoken = [s for s in segments if s[0] != "pau"]
    split = int(spoken[phones - 1][1] * RATE)
    x, cut = _trim(x)
    return x, split - cut


def _say(engine: str, voice: str, wpm: int, text: str, fast: bool = False) -> np.ndarray:
    if engine == "espeak":
        return _trim(_espeak(text, voice, int(wpm * (1.3 if fast else 1))))[0]
    if engine == "festival":
        with tempfile.TemporaryDirectory() as tmp:
            Path(f"{tmp}/t.txt").write_text(text)
            subprocess.run(
                ["text2wave", "-eval", f"(voice_{voice})", f"{tmp}/t.txt", "-o", f"{tmp}/t.wav"],
                check=True, capture_output=True,
            )
            x = _trim(_read_wav(f"{tmp}/t.wav"))[0]
    else:
        x = _trim(_flite(text, voice)[0])[0]
    if fast:  # backchannels are quick: 1.3 times as fast, pitch kept
        x = soxr.resample(x, RATE, int(RATE / 1.3)).astype(np.float32)
    return x


# ---------------------------------------------------------------------------- noise


def _bursts(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Non-speech sounds as loud as speech: a cough, clicks, a knock, a door."""
    t = np.arange(int(0.35 * RATE)) / RATE
    cough = rng.normal(0, 1, t.size) * np.exp(-t / 0.08) * (1 - np.exp(-t / 0.01))
    cough = np.convolve(cough, np.ones(6) / 6, mode="same")  # a little darker than white
    clicks = np.zeros(int(0.5 * RATE))
    for at in (0.0, 0.12, 0.31):
        i = int(at * RATE)
        clicks[i : i + 40] = rng.normal(0, 1, 40) * np.exp(-np.arange(40) / 8)
    tk = np.arange(int(0.25 * RATE)) / RATE
    knock = np.sin(2 * np.pi * 180 * tk) * np.exp(-tk / 0.03)
    knock = np.concatenate((knock, np.zeros(int(0.15 * RATE)), knock))
    td = np.arange(int(0.6 * RATE)) / RATE
    door = (np.sin(2 * np.pi * 70 * td) + 0.4 * rng.normal(0, 1, td.size)) * np.exp(-td / 0.12)
    out = {}
    for name, x in (("cough", cough), ("clicks", clicks), ("knock", knock), ("door", door)):
        peak = np.abs(x).max()
        out[name] = (x / peak * 10 ** (-6 / 20)).astype(np.float32)  # peaks at -6 dBFS
    return out


def noise(kind: str, seconds: float, rng: np.random.Generator, babble: np.ndarray | None = None) -> np.ndarray:
    """A background at -20 dBFS RMS: white, pink, or babble."""
    n = int(seconds * RATE)
    if kind == "white":
        x = rng.normal(0, 1, n)
    elif kind == "pink":
        spectrum = np.fft.rfft(rng.normal(0, 1, n))
        spectrum /= np.sqrt(np.maximum(1, np.arange(spectrum.size)))
        x = np.fft.irfft(spectrum, n)
    else:
        assert babble is not None
        start = int(rng.integers(0, max(1, babble.size - n)))
        x = np.resize(np.roll(babble, -start), n)
    x = x / np.sqrt((x**2).mean())
    return (x * 10 ** (LEVEL_DBFS / 20)).astype(np.float32)


def mix_at_snr(background: np.ndarray, snr_db: float) -> np.ndarray:
    """The background scaled to sit `snr_db` below speech at LEVEL_DBFS."""
    return (background * 10 ** (-snr_db / 20)).astype(np.float32)


# ---------------------------------------------------------------------------- the set


def _make() -> None:
    ROOT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(38)
    manifest: dict[str, object] = {"voices": [], "sentences": SENTENCES}
    for engine, voice, wpm in VOICES:
        name = f"{engine}:{voice}"
        sentences, splits, backchannels, interruptions = [], [], [], []
        for head, tail in SENTENCES:
            if engine == "espeak":
                x, split = _espeak_sentence(head, tail, voice, wpm)
            elif engine == "festival":
                x, split = _festival_sentence(head, tail, voice)
            else:
                x, split = _flite_sentence(head, tail, voice)
            sentences.append(_normalise(x))
            splits.append(split)
        for text in BACKCHANNELS:
            backchannels.append(_normalise(_say(engine, voice, wpm, text, fast=True)))
        for text in INTERRUPTIONS:
            interruptions.append(_normalise(_say(engine, voice, wpm, text)))
        np.savez_compressed(
            ROOT / f"{name.replace(':', '_').replace('+', '_')}.npz",
            splits=np.array(splits),
            **{f"s{i}": x for i, x in enumerate(sentences)},
            **{f"b{i}": x for i, x in enumerate(backchannels)},
            **{f"i{i}": x for i, x in enumerate(interruptions)},
        )
        manifest["voices"].append(name)  # type: ignore[union-attr]
        print(f"  {name}: {len(sentences)} sentences, {len(backchannels)} backchannels", file=sys.stderr)
    voices = [_normalise(_espeak(text, v, 160)) for text, v in zip(BABBLE, ("en-us", "en-gb", "en-us+f2", "en-us+m3"))]
    size = max(v.size for v in voices)
    babble = sum(np.resize(v, size) for v in voices)
    np.savez_compressed(ROOT / "noise.npz", babble=babble.astype(np.float32), **_bursts(rng))
    (ROOT / "manifest.json").write_text(json.dumps(manifest))


def load() -> SpokenSet:
    """The set, made first if it is not there yet."""
    if not (ROOT / "manifest.json").exists():
        print("making the spoken test set (once) ...", file=sys.stderr)
        _make()
    manifest = json.loads((ROOT / "manifest.json").read_text())
    sentences: dict[str, list[Utterance]] = {}
    backchannels: dict[str, list[np.ndarray]] = {}
    interruptions: dict[str, list[np.ndarray]] = {}
    for name in manifest["voices"]:
        data = np.load(ROOT / f"{name.replace(':', '_').replace('+', '_')}.npz")
        splits = data["splits"]
        sentences[name] = [
            Utterance(name, f"{h} {t}", data[f"s{i}"], int(splits[i])) for i, (h, t) in enumerate(manifest["sentences"])
        ]
        backchannels[name] = [data[f"b{i}"] for i in range(len(BACKCHANNELS))]
        interruptions[name] = [data[f"i{i}"] for i in range(len(INTERRUPTIONS))]
    extra = np.load(ROOT / "noise.npz")
    bursts = {k: extra[k] for k in ("cough", "clicks", "knock", "door")}
    return SpokenSet(sentences, backchannels, interruptions, extra["babble"], bursts)


def main() -> None:
    spoken = load()
    for voice in spoken.voices:
        lengths = [len(u.audio) / RATE for u in spoken.sentences[voice]]
        bc = [len(b) / RATE for b in spoken.backchannels[voice]]
        print(f"{voice:32s} sentences {np.mean(lengths):.2f} s on average; backchannels {min(bc):.2f}-{max(bc):.2f} s")


if __name__ == "__main__":
    main()
