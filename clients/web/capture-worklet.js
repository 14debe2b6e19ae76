// Microphone capture on the audio thread: Float32 at the context's rate in,
// PCM16 frames at the target rate (16 kHz) out, posted to the main thread.
//
// Samples are clamped to [-1, 1] before scaling: a plain x * 32768 wraps +1.0
// round to -32768, a loud click on every clipped peak. When the context does
// not run at the target rate (a browser may refuse AudioContext({sampleRate:
// 16000}), or refuse to connect a microphone to one), a windowed-sinc filter
// converts any ratio, integer or not, and removes what 16 kHz cannot carry
// before it folds back into the speech band.

import { SincResampler } from "./sinc-resampler.js";

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.targetRate = opts.targetRate || 16000;
    this.frameSamples = Math.round((this.targetRate * (opts.frameMs || 20)) / 1000);
    this.resampler = sampleRate === this.targetRate ? null : new SincResampler(sampleRate, this.targetRate);
    this.frame = new Int16Array(this.frameSamples);
    this.filled = 0;
    this.emit = (x) => this.push(x);
    this.running = true;
    this.port.onmessage = (event) => {
      if (event.data && event.data.type === "stop") this.running = false;
    };
  }

  push(x) {
    const clamped = x > 1 ? 1 : x < -1 ? -1 : x;
    this.frame[this.filled++] = clamped < 0 ? clamped * 32768 : clamped * 32767;
    if (this.filled === this.frameSamples) {
      const out = this.frame;
      this.port.postMessage(out.buffer, [out.buffer]);
      this.frame = new Int16Array(this.frameSamples);
      this.filled = 0;
    }
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return this.running;
    if (this.resampler) this.resampler.process(channel, this.emit);
    else for (let i = 0; i < channel.length; i++) this.push(channel[i]);
    return this.running;
  }
}

registerProcessor("live-capture", CaptureProcessor);
