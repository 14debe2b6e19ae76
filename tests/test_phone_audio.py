"""Telephone audio: G.711 both laws and the streaming resamplers a call uses."""

from __future__ import annotations

import numpy as np

from live.phone.audio import FrameCutter, Resampler, alaw_decode, alaw_encode, ulaw_decode, ulaw_encode


def pcm(values) -> bytes:
    return np.asarray(values, "<i2").tobytes()


def samples(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.int32)


def test_g711_decodes_the_standard_code_points():
    # ITU-T G.711: μ-law 0xFF is zero and 0x00 the most negative step; A-law 0xD5/0x55 are ±8.
    assert samples(ulaw_decode(bytes([0xFF, 0x7F, 0x00, 0x80]))).tolist() == [0, 0, -32124, 32124]
    assert samples(alaw_decode(bytes([0xD5, 0x55, 0x2A, 0xAA]))).tolist() == [8, -8, -32256, 32256]


def test_every_code_survives_a_decode_and_encode():
    codes = bytes(range(256))
    assert alaw_encode(alaw_decode(codes)) == codes
    # μ-law has two zeros (0x7F and 0xFF); every other code comes back as it was.
    back = ulaw_encode(ulaw_decode(codes))
    assert ulaw_decode(back) == ulaw_decode(codes)
    assert sum(a != b for a, b in zip(back, codes)) == 1


def test_g711_keeps_speech_within_its_quantisation_step():
    rng = np.random.default_rng(1)
    x = rng.integers(-32768, 32767, 20_000).astype("<i2")
    for encode, decode in ((ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)):
        y = samples(decode(encode(x.tobytes())))
        error = np.abs(y - x.astype(np.int32))
        # Logarithmic: the error grows with the level, about 1/16 of it at most.
        assert np.all(error <= np.maximum(16, np.abs(x.astype(np.int32)) // 15))
    tone = (8000 * np.sin(2 * np.pi * 440 * np.arange(8000) / 8000)).astype("<i2")
    y = samples(ulaw_decode(ulaw_encode(tone.tobytes())))
    snr = 10 * np.log10(np.sum(tone.astype(float) ** 2) / np.sum((y - tone) ** 2))
    assert snr > 35  # G.711's ~38 dB for a loud tone


def test_the_resampler_streams_without_losing_samples_or_tone():
    rate_in, rate_out = 24_000, 8_000
    t = np.arange(rate_in * 2) / rate_in
    tone = (10_000 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()
    resample = Resampler(rate_in, rate_out)
    out = b"".join(resample(tone[i : i + 963]) for i in range(0, len(tone), 963))  # odd chunk sizes
    got = samples(out)
    # The filter holds back under 40 ms (the rest comes with the next chunk); all else is out.
    assert rate_out * 2 - 320 < len(got) <= rate_out * 2
    spectrum = np.abs(np.fft.rfft(got[1000:9000]))
    peak_hz = np.argmax(spectrum) * rate_out / 8000
    assert abs(peak_hz - 440) < 2


def test_downsampling_removes_what_the_phone_cannot_carry():
    # A 6 kHz tone is above 8 kHz's Nyquist: dropping samples would alias it to 2 kHz.
    t = np.arange(24_000) / 24_000
    tone = (10_000 * np.sin(2 * np.pi * 6000 * t)).astype("<i2").tobytes()
    got = samples(Resampler(24_000, 8_000)(tone))
    assert np.sqrt(np.mean(got[500:].astype(float) ** 2)) < 100


def test_frames_are_cut_to_size_and_the_remainder_waits():
    cut = FrameCutter(160)
    assert cut(b"\x01" * 100) == []
    frames = cut(b"\x02" * 300)
    assert [len(f) for f in frames] == [160, 160] and len(cut) == 80
    assert cut.flush(0xFF) == b"\x02" * 80 + b"\xff" * 80
    assert cut.flush(0xFF) is None


def _level_db(rate_in: int, rate_out: int, hz: float) -> float:
    t = np.arange(rate_in) / rate_in
    tone = (8000 * np.sin(2 * np.pi * hz * t)).astype("<i2").tobytes()
    step = rate_in // 50 * 2  # 20 ms frames, as a call carries them
    resample = Resampler(rate_in, rate_out)
    got = samples(b"".join(resample(tone[i : i + step]) for i in range(0, len(tone), step)))[rate_out // 10 :]
    sent = np.sqrt(np.mean(samples(tone).astype(float) ** 2))
    return 20 * np.log10(np.sqrt(np.mean(got.astype(float) ** 2)) / sent)


def test_the_whole_phone_band_reaches_the_model_and_the_caller():
    # A phone carries 300-3400 Hz; the caller's 8 kHz goes up to the model's
    # 16 kHz and the model's 24 kHz comes down to 8 kHz without losing its top
    # (the first resampler cut 3.4 kHz by 7.9 dB).
    for rates in ((8_000, 16_000), (24_000, 8_000), (24_000, 16_000)):
        for hz in (300, 1000, 3400):
            assert abs(_level_db(*rates, hz)) < 0.5, (rates, hz)


def test_the_resampler_holds_back_no_more_than_its_filter():
    # A click in the caller's first frame comes out of that same frame's
    # resampling, within 2 ms of where it was: nothing waits for a later frame.
    resample = Resampler(8_000, 16_000)
    frame = np.zeros(160, "<i2")
    frame[40] = 20_000
    out = samples(resample(frame.tobytes()))
    assert len(out) == 320
    assert abs(int(np.argmax(np.abs(out))) - 80) <= 32
    # At the end of a reply, what waits for a whole block comes out, padded.
    down = Resampler(24_000, 8_000)
    assert len(down(bytes(2 * 100))) + len(down.flush()) >= 2 * 100 // 3
