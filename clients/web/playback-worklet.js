// Reply playback on the audio thread: PCM16 chunks at 24 kHz in, speaker out.
//
// Playback starts once `prebufferMs` of audio is queued (or the reply is marked
// complete), so network jitter does not become clicks; a queue that runs dry
// mid-reply waits for the prebuffer again. "flush" empties the queue at once
// (the user barged in). When the context runs at another rate (44.1/48 kHz),
// each chunk is resampled as it arrives by a windowed-sinc filter, so no
// mirror images of the voice land above 12 kHz. Counters, always in 24 kHz
// samples, go back to the main thread about every 50 ms, and at once after
// every flush or start/stop, with the level (RMS) of what played meanwhile.

import { SincResampler } from "./sinc-resampler.js";

const SOURCE_RATE = 24000;

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.prebuffer = Math.round((sampleRate * (opts.prebufferMs ?? 100)) / 1000); // output samples
    this.step = SOURCE_RATE / sampleRate; // source samples per output sample
    this.resampler = this.step === 1 ? null : new SincResampler(SOURCE_RATE, sampleRate);
    this.chunks = []; // Float32Array at the context's rate, oldest first
    this.offset = 0; // read position in chunks[0]
    this.queued = 0; // output samples waiting
    this.playing = false;
    this.ending = false;
    this.played = 0; // output samples played
    this.flushed = 0;
    this.underruns = 0;
    this.sinceReport = 0;
    this.energy = 0; // sum of squares of what played since the last report
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  push(samples) {
    if (!samples.length) return;
    this.chunks.push(samples);
    this.queued += samples.length;
  }

  resample(samples) {
    const out = [];
    this.resampler.process(samples, (y) => out.push(y));
    return Float32Array.from(out);
  }

  onMessage(msg) {
    if (msg instanceof ArrayBuffer) {
      const pcm = new Int16Array(msg);
      const samples = new Float32Array(pcm.length);
      for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 32768;
      this.push(this.resampler ? this.resample(samples) : samples);
      return;
    }
    if (msg.type === "flush") {
      const dropped = this.queued;
      this.flushed += dropped;
      this.chunks = [];
      this.offset = 0;
      this.queued = 0;
      this.ending = false;
      if (this.resampler) this.resampler = new SincResampler(SOURCE_RATE, sampleRate);
      this.playing = false;
      // What this flush dropped, in 24 kHz samples, for the server.
      this.report({ flushId: msg.id, dropped: Math.round(dropped * this.step) });
    } else if (msg.type === "end") {
      // The reply is complete: play its tail without waiting for the prebuffer
      // (and push the resampler's last half-kernel out with silence). With
      // nothing queued there is no tail, and the next reply keeps its prebuffer.
      if (this.resampler) this.push(this.resample(new Float32Array(Math.ceil(this.resampler.half) + 2)));
      if (this.queued > 0) this.ending = true;
    }
  }

  setPlaying(playing) {
    if (this.playing !== playing) {
      this.playing = playing;
      this.report();
    }
  }

  report(extra = {}) {
    // The level of what played since the last report (RMS, 0 to 1): the page's meter.
    const level = this.sinceReport > 0 ? Math.sqrt(this.energy / this.sinceReport) : 0;
    this.sinceReport = 0;
    this.energy = 0;
    const source = (n) => Math.round(n * this.step);
    this.port.postMessage({
      ...extra,
      type: "stats",
      played: source(this.played),
      queued: source(this.queued),
      flushed: source(this.flushed),
      underruns: this.underruns,
      playing: this.playing,
      level,
    });
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    if (!this.playing && this.queued > 0 && (this.queued >= this.prebuffer || this.ending)) {
      this.setPlaying(true);
    }
    let i = 0;
    if (this.playing) {
      while (i < out.length && this.queued > 0) {
        const chunk = this.chunks[0];
        const n = Math.min(out.length - i, chunk.length - this.offset);
        out.set(chunk.subarray(this.offset, this.offset + n), i);
        i += n;
        this.offset += n;
        this.queued -= n;
        this.played += n;
        if (this.offset >= chunk.length) {
          this.chunks.shift();
          this.offset = 0;
        }
      }
      if (this.queued === 0) {
        if (!this.ending && i < out.length) this.underruns++;
        this.ending = false;
        this.setPlaying(false);
      }
    }
    for (let k = 0; k < i; k++) this.energy += out[k] * out[k];
    for (; i < out.length; i++) out[i] = 0;
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    this.sinceReport += out.length;
    if (this.sinceReport >= sampleRate / 20) this.report();
    return true;
  }
}

registerProcessor("live-playback", PlaybackProcessor);
