// A streaming resampler for the audio worklets: any ratio, integer or not.
//
// Each output sample is the input convolved with a Blackman-windowed sinc
// low-pass, centred on the output's exact position in the input. The cut-off
// sits at 85% of the lower rate's Nyquist frequency, so what the lower rate
// cannot carry is removed before it can fold back (downsampling) or mirror
// (upsampling) into the audible band: a tone above the target's Nyquist
// comes out more than 40 dB down. 16 zero crossings a side; the kernel is
// tabulated once and read with linear interpolation. Latency: half the
// kernel, about 1 ms.

const ZEROS = 16;
const CUTOFF = 0.85;
const TABLE_STEPS = 512; // table entries per input sample

export class SincResampler {
  constructor(fromRate, toRate) {
    this.step = fromRate / toRate; // input samples per output sample
    const fc = CUTOFF * Math.min(1, toRate / fromRate); // in units of the input's Nyquist
    this.half = ZEROS / fc; // kernel half-width, in input samples
    const n = Math.ceil(this.half * TABLE_STEPS) + 2;
    this.table = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      const t = i / TABLE_STEPS;
      if (t >= this.half) break;
      const x = Math.PI * fc * t;
      const sinc = t === 0 ? 1 : Math.sin(x) / x;
      const w = t / this.half; // 0 at the centre, 1 at the edge
      const blackman = 0.42 + 0.5 * Math.cos(Math.PI * w) + 0.08 * Math.cos(2 * Math.PI * w);
      this.table[i] = fc * sinc * blackman;
    }
    this.buffer = new Float32Array(1024);
    this.length = 0; // samples held in `buffer`
    this.pos = this.half; // next output position, in buffer indices (starts a half-kernel in)
  }

  kernel(distance) {
    const f = Math.abs(distance) * TABLE_STEPS;
    const i = f | 0;
    if (i + 1 >= this.table.length) return 0;
    const frac = f - i;
    return this.table[i] + (this.table[i + 1] - this.table[i]) * frac;
  }

  /** Feed input samples; `emit(y)` is called for each output sample they complete. */
  process(input, emit) {
    if (this.length + input.length > this.buffer.length) {
      const bigger = new Float32Array(2 * (this.length + input.length));
      bigger.set(this.buffer.subarray(0, this.length));
      this.buffer = bigger;
    }
    this.buffer.set(input, this.length);
    this.length += input.length;
    const x = this.buffer;
    while (this.pos + this.half < this.length - 1) {
      const first = Math.max(0, Math.ceil(this.pos - this.half));
      const last = Math.floor(this.pos + this.half);
      let y = 0;
      for (let i = first; i <= last; i++) y += x[i] * this.kernel(this.pos - i);
      emit(y);
      this.pos += this.step;
    }
    // Keep only the history the next output still needs.
    const drop = Math.max(0, Math.floor(this.pos - this.half) - 1);
    if (drop > 0) {
      x.copyWithin(0, drop, this.length);
      this.length -= drop;
      this.pos -= drop;
    }
  }
}
