// Microphone capture on the audio thread: Float32 at the context's rate in,
// PCM16 frames at the target rate (16 kHz) out, posted to the main thread.
//
// Samples are clamped to [-1, 1] before scaling: a plain x * 32768 wraps +1.0
// round to -32768, a loud click on every clipped peak. When the context does
// not run at the target rate (a browser may refuse AudioContext({sampleRate:
// 16000})), an area-averaging resampler converts any ratio, integer or not:
// each output sample is the mean of the input over its own 1/targetRate
// interval, which also filters out what the lower rate cannot carry.

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.targetRate = opts.targetRate || 16000;
    this.frameSamples = Math.round((this.targetRate * (opts.frameMs || 20)) / 1000);
    this.ratio = sampleRate / this.targetRate; // input samples per output sample
    this.frame = new Int16Array(this.frameSamples);
    this.filled = 0;
    this.acc = 0; // area-averaging: sum and width of the current output interval
    this.width = 0;
    this.pos = 0; // linear interpolation (upsampling): position of the next output
    this.prev = 0;
    this.running = true;
    this.port.onmessage = (event) => {
      if (event.data && event.data.type === "stop") this.running = false;
    };
  }

  emit(x) {
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
    const ratio = this.ratio;
    if (ratio === 1) {
      for (let i = 0; i < channel.length; i++) this.emit(channel[i]);
    } else if (ratio > 1) {
      for (let i = 0; i < channel.length; i++) {
        const x = channel[i];
        let left = 1;
        while (left > 0) {
          const take = Math.min(left, ratio - this.width);
          this.acc += x * take;
          this.width += take;
          left -= take;
          if (this.width >= ratio - 1e-9) {
            this.emit(this.acc / ratio);
            this.acc = 0;
            this.width = 0;
          }
        }
      }
    } else {
      // Upsampling: output positions step by `ratio` input samples between prev and x.
      for (let i = 0; i < channel.length; i++) {
        const x = channel[i];
        while (this.pos <= 1) {
          this.emit(this.prev + (x - this.prev) * this.pos);
          this.pos += ratio;
        }
        this.pos -= 1;
        this.prev = x;
      }
    }
    return this.running;
  }
}

registerProcessor("live-capture", CaptureProcessor);
