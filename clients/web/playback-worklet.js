// Reply playback on the audio thread: PCM16 chunks at 24 kHz in, speaker out.
//
// Playback starts once `prebufferMs` of audio is queued (or the reply is marked
// complete), so network jitter does not become clicks; a queue that runs dry
// mid-reply waits for the prebuffer again. "flush" empties the queue at once
// (the user barged in). When the context runs at another rate, samples are
// linearly interpolated. Counters go back to the main thread about every
// 50 ms, and at once after every flush or start/stop.

const SOURCE_RATE = 24000;

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.prebuffer = Math.round((SOURCE_RATE * (opts.prebufferMs ?? 100)) / 1000);
    this.step = SOURCE_RATE / sampleRate; // source samples per output sample
    this.chunks = []; // Float32Array, oldest first
    this.offset = 0; // read position in chunks[0]
    this.queued = 0; // source samples waiting
    this.playing = false;
    this.ending = false;
    this.frac = 0; // interpolation position between `last` and the next sample
    this.last = 0;
    this.played = 0; // source samples consumed
    this.flushed = 0;
    this.underruns = 0;
    this.sinceReport = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  onMessage(msg) {
    if (msg instanceof ArrayBuffer) {
      const pcm = new Int16Array(msg);
      const samples = new Float32Array(pcm.length);
      for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 32768;
      this.chunks.push(samples);
      this.queued += samples.length;
      return;
    }
    if (msg.type === "flush") {
      const dropped = this.queued;
      this.flushed += dropped;
      this.chunks = [];
      this.offset = 0;
      this.queued = 0;
      this.ending = false;
      this.playing = false;
      this.report({ flushId: msg.id, dropped }); // what this flush dropped, for the server
    } else if (msg.type === "end") {
      // The reply is complete: play its tail without waiting for the prebuffer.
      // With nothing queued there is no tail, and the next reply keeps its prebuffer.
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
    this.sinceReport = 0;
    this.port.postMessage({
      ...extra,
      type: "stats",
      played: this.played,
      queued: this.queued,
      flushed: this.flushed,
      underruns: this.underruns,
      playing: this.playing,
    });
  }

  next() {
    // The next source sample; the caller has checked that one is queued.
    const chunk = this.chunks[0];
    const x = chunk[this.offset++];
    if (this.offset >= chunk.length) {
      this.chunks.shift();
      this.offset = 0;
    }
    this.queued--;
    this.played++;
    return x;
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    if (!this.playing && this.queued > 0 && (this.queued >= this.prebuffer || this.ending)) {
      this.setPlaying(true);
    }
    let i = 0;
    if (this.playing) {
      if (this.step === 1) {
        for (; i < out.length && this.queued > 0; i++) out[i] = this.next();
      } else {
        for (; i < out.length; i++) {
          while (this.frac >= 1 && this.queued > 0) {
            this.last = this.next();
            this.frac -= 1;
          }
          if (this.frac >= 1) break;
          const ahead = this.queued > 0 ? this.chunks[0][this.offset] : this.last;
          out[i] = this.last + (ahead - this.last) * this.frac;
          this.frac += this.step;
        }
      }
      if (this.queued === 0) {
        if (!this.ending && i < out.length) this.underruns++;
        this.ending = false;
        this.setPlaying(false);
      }
    }
    for (; i < out.length; i++) out[i] = 0;
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    this.sinceReport += out.length;
    if (this.sinceReport >= sampleRate / 20) this.report();
    return true;
  }
}

registerProcessor("live-playback", PlaybackProcessor);
