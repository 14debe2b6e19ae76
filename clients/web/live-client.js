// LiveClient: the browser side of the live session protocol (docs/protocol.md).
//
//   import { LiveClient } from "/client/live-client.js";
//   const live = new LiveClient({ tools: { get_time: () => ({ now: Date.now() }) } });
//   live.addEventListener("transcript.output", (e) => show(e.detail.text));
//   await live.startMicrophone();    // from a click, before any other await: makes the
//                                    // audio contexts while the gesture is handled
//   await live.connect();            // same-origin ws(s)://HOST/live by default
//   await live.startCamera();        // or startScreen(): about a JPEG a second; stopVideo()
//
// No dependencies. The microphone is captured by an AudioWorklet at 16 kHz and
// sent as 20 ms PCM16 binary frames; the agent's 24 kHz replies play through a
// second AudioWorklet with a 100 ms prebuffer, flushed at once on
// `turn.interrupted`. Every server event is re-dispatched as a CustomEvent of
// the same type with the message as `detail`; "reply.latency" gives, per reply,
// the seconds from the end of the user's speech (or typed turn) to its first
// audio, and `levels()` how loud the microphone and the agent are now (for
// meters); "state" reports the connection,
// the microphone, whether the agent is audible and whether the microphone is
// gated. The Gemini key never reaches the page: the server holds it.
//
// Echo: by default (`halfDuplex: true`, as `live mic`) nothing is sent while
// the agent's reply plays and for `gateTailMs` after, because the browser's
// echo canceller has not covered Web Audio output on every platform; with
// headphones, `setHalfDuplex(false)` keeps the microphone open for barge-in.
//
// Browsers give microphones and audio worklets only to secure contexts
// (https:// pages, or http://localhost): elsewhere `connect()` and
// `startMicrophone()` fail at once with the code `insecure_context`.

import { LATE_TAIL_WAIT_MS, LateTails } from "./late-tails.js";
import { VideoCapture } from "./video-capture.js";

const INPUT_RATE = 16000;
const OUTPUT_RATE = 24000;
const PENDING_PLAYBACK_LIMIT = 250; // chunks held while the playback worklet loads (~10 s)
const EARLY_FRAMES_LIMIT = 500; // microphone frames held while the session starts (10 s of 20 ms)
// A microphone frame at least this loud (RMS, full scale 1; about -34 dBFS) is
// the user speaking: the turn's latency is timed from the last such frame.
const SPEECH_LEVEL = 0.02;
// A level not renewed for this long (ms) reads as silence (the source stopped).
const LEVEL_STALE_MS = 250;

const SERVER_EVENTS = [
  "session.started", "transcript.input", "transcript.output", "text", "tool.call",
  "tool.result", "tool.cancelled", "turn.interrupted", "generation.complete",
  "turn.complete", "usage", "session.go_away", "session.reconnecting",
  "session.resumed", "session.reattached", "user.muted", "error", "session.closed",
  // With "turn_taking": "server": the server heard the user start speaking, and
  // ended their turn (or left speech over the reply alone), saying why.
  "user.speaking", "user.stopped",
];

// Backoff between attempts to reattach after the socket dropped (ms); the last
// repeats until REATTACH_FOR_MS have passed.
const REATTACH_DELAYS_MS = [200, 500, 1000, 2000, 4000];
const REATTACH_FOR_MS = 30000;

/** The server's WebSocket on this page's origin: ws:// for http pages, wss:// for https. */
export function defaultUrl(path = "/live") {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}${path}`;
}

/** A refused session, a lost connection or a missing microphone; `code` is machine-readable. */
export class LiveError extends Error {
  constructor(code, message, fatal = true) {
    super(message);
    this.name = "LiveError";
    this.code = code;
    this.fatal = fatal;
  }
}

/** Why this page cannot use the microphone or play audio, or null when it can. */
export function insecureContextMessage() {
  if (globalThis.isSecureContext !== false) return null;
  return (
    `this page (${location.origin}) is not a secure context, so the browser gives it no ` +
    "microphone and no audio worklets. Open it over https:// (start the server with " +
    "--certfile and --keyfile) or from http://localhost on the server's own machine."
  );
}

/** A server text frame as an event object; null for audio or a frame that is not JSON. */
function textEvent(event) {
  if (typeof event.data !== "string") return null;
  try {
    return JSON.parse(event.data);
  } catch {
    return null;
  }
}

function microphoneError(error) {
  const name = (error && error.name) || "Error";
  if (name === "NotAllowedError" || name === "SecurityError") {
    return new LiveError(
      "microphone_denied",
      "the microphone is blocked for this page. Allow it from the icon at the left of the " +
      "address bar (site settings → microphone), then press Start talking again.",
      false,
    );
  }
  if (name === "NotFoundError" || name === "OverconstrainedError") {
    return new LiveError("microphone_unavailable", "no microphone was found: plug one in and try again", false);
  }
  if (name === "NotReadableError" || name === "AbortError") {
    return new LiveError(
      "microphone_unavailable",
      "the microphone is in use by another program or could not be started: close the other program and try again",
      false,
    );
  }
  return new LiveError("microphone_unavailable", `the microphone could not be used (${name}: ${error && error.message})`, false);
}

export class LiveClient extends EventTarget {
  /**
   * @param {object} [options]
   * @param {Object<string, function(object, object): any>} [options.tools] handlers for
   *   client-run tools: name -> (args, call) => response (a JSON object, or a promise of one)
   * @param {number} [options.prebufferMs] reply audio held before playback starts (100)
   * @param {number} [options.frameMs] microphone frame length, 20-40 ms (20)
   * @param {boolean} [options.halfDuplex] mute the microphone while the agent is audible (true)
   * @param {number} [options.gateTailMs] how long it stays muted after the reply drains (300)
   * @param {number} [options.startTimeoutMs] how long connect() waits for session.started (15000)
   * @param {number|null} [options.lateTailWaitMs] how long a reply's final transcript and its
   *   turn.complete wait for the last words Gemini may send after the turn ended, folded into
   *   that final (300; see late-tails.js); null: events exactly as the server sends them
   */
  constructor({
    tools = {}, prebufferMs = 100, frameMs = 20, halfDuplex = true, gateTailMs = 300, startTimeoutMs = 15000,
    lateTailWaitMs = LATE_TAIL_WAIT_MS,
  } = {}) {
    super();
    this._tails = new LateTails((msg) => this._emit(msg.type, msg), lateTailWaitMs);
    this.tools = { ...tools };
    this.prebufferMs = prebufferMs;
    this.frameMs = frameMs;
    this.halfDuplex = halfDuplex;
    this.gateTailMs = gateTailMs;
    this.startTimeoutMs = startTimeoutMs;
    this.session = null;
    this.state = { connection: "idle", microphone: false, agentSpeaking: false, microphoneGated: false };
    this._ws = null;
    this._capture = null; // { context, node, source, stream }
    this._playback = null; // { context, node, ready, pending }
    this._opening = null; // the microphone being asked for
    this._early = []; // microphone frames captured before the session started
    this._epoch = 0; // bumped by close/teardown: cancels what was under way
    this._closedByServer = false;
    this._pendingTools = new Set();
    this._replySamples = 0; // reply audio received since the last turn boundary
    this._flushId = 0;
    this._playbackReport = null; // { id, received } while a flush's count is awaited
    this._lastAudibleAt = -Infinity; // when reply audio was last queued or playing
    // Meters: the last level of each side (RMS, 0 to 1) and when it was measured.
    this._levels = { microphone: 0, microphoneAt: -Infinity, agent: 0, agentAt: -Infinity };
    this._lastSpeechAt = null; // the user's last loud frame sent (or typed turn), awaiting a reply
    this._replyOpen = false; // reply audio arrived since the last turn boundary
    this._counters = {
      framesSent: 0, bytesSent: 0, framesGated: 0, samplesReceived: 0, flushes: 0,
      samplesPlayed: 0, queuedSamples: 0, samplesFlushed: 0, underruns: 0, playbackDropped: 0,
    };
  }

  // ------------------------------------------------------------------ public API

  /** Subscribe to one event type; returns a function that unsubscribes. */
  on(type, handler) {
    const listener = (event) => handler(event.detail, event);
    this.addEventListener(type, listener);
    return () => this.removeEventListener(type, listener);
  }

  /**
   * Open the socket and start a session. Resolves with the `session.started`
   * message; rejects with a LiveError (`unauthorized`, `capacity`, `timeout`,
   * `insecure_context`, `token_unavailable`, ...), after which the client is
   * closed and holds nothing (no audio context, no microphone).
   * `token` is a string, or a function returning one (or a promise of one),
   * called on every connect: the hook to fetch a fresh short-lived token
   * from the app's backend, so no secret ever lives in the page.
   */
  async connect(url = defaultUrl(), { token, history, startTimeoutMs = this.startTimeoutMs } = {}) {
    if (this._ws) throw new LiveError("already_connected", "this client is already connected", false);
    const epoch = this._epoch;
    this._setState({ connection: "connecting" });
    let ws;
    const tokenSource = token; // asked again on every reattach (a server that requires tokens wants one)
    try {
      const insecure = insecureContextMessage();
      if (insecure) throw new LiveError("insecure_context", insecure);
      this._preparePlayback(); // when connect() is what the click calls first (else startMicrophone made it)
      if (typeof token === "function") {
        try {
          token = await token();
        } catch (error) {
          throw new LiveError("token_unavailable", `could not get a session token: ${error.message || error}`, true);
        }
      }
      if (epoch !== this._epoch) throw new LiveError("cancelled", "the session was ended while it was starting", false);
      ws = new WebSocket(url);
    } catch (error) {
      if (epoch !== this._epoch) throw error; // close() came first and cleaned up
      this._teardown();
      throw this._report(error instanceof LiveError ? error : new LiveError("connection_failed", `cannot connect to ${url}: ${error.message}`));
    }
    ws.binaryType = "arraybuffer";
    this._ws = ws;
    this._url = url;
    this._tokenSource = tokenSource;
    this._lastSeq = 0;
    this._closedByServer = false;
    const started = new Promise((resolve, reject) => {
      let refusal = null;
      const onMessage = (event) => {
        const msg = textEvent(event);
        if (!msg) return;
        if (msg.type === "session.started") {
          cleanup();
          resolve(msg);
        } else if (msg.type === "error") {
          refusal = new LiveError(msg.code, msg.message, msg.fatal);
        }
      };
      const onClose = () => {
        cleanup();
        reject(refusal || new LiveError("connection_failed", `could not start a session at ${url}`));
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(new LiveError("timeout", `the server at ${url} did not start a session within ${startTimeoutMs / 1000} s`));
      }, startTimeoutMs);
      const cleanup = () => {
        clearTimeout(timer);
        ws.removeEventListener("message", onMessage);
        ws.removeEventListener("close", onClose);
      };
      ws.addEventListener("message", onMessage);
      ws.addEventListener("close", onClose);
    });
    ws.addEventListener("open", () => {
      // reports_playback: after a barge-in this client says how much of the reply it
      // played, so the server can say what the user heard (transcript.output, heard: true).
      const start = { type: "session.start", input_audio: { rate: INPUT_RATE }, reports_playback: true };
      if (token) start.token = token;
      if (history && history.length) start.history = history;
      ws.send(JSON.stringify(start));
    });
    try {
      this.session = await started;
      if (epoch !== this._epoch) throw new LiveError("cancelled", "the session was ended while it was starting", false);
    } catch (error) {
      ws.close();
      const cancelled = epoch !== this._epoch;
      if (this._ws === ws) this._teardown();
      if (cancelled) throw new LiveError("cancelled", "the session was ended while it was starting", false);
      throw this._report(error);
    }
    // Events from this socket only while it is the current one: a late `close`
    // from an old socket must not end a newer session on a reused client.
    ws.addEventListener("message", (event) => { if (this._ws === ws) this._onMessage(event.data); });
    ws.addEventListener("close", (event) => { if (this._ws === ws) this._onClose(event); });
    this._setState({ connection: "open" });
    this._emit("session.started", this.session);
    const early = this._early;
    this._early = [];
    for (const frame of early) this._sendFrame(frame);
    return this.session;
  }

  /**
   * Ask for the microphone and stream it once connected. Call it first, from
   * a click: a denied or missing microphone is then known before a model
   * session is opened. The constraints default to the browser's echo
   * cancellation, noise suppression and gain control. Rejects with a
   * LiveError (`microphone_denied`, `microphone_unavailable`, `cancelled`
   * when close() came first), also dispatched as an "error" event.
   */
  async startMicrophone({ deviceId, echoCancellation = true, noiseSuppression = true, autoGainControl = true } = {}) {
    if (this._capture) return;
    if (this._opening) return this._opening;
    const epoch = this._epoch;
    this._opening = this._openMicrophone(epoch, {
      audio: {
        channelCount: 1, echoCancellation, noiseSuppression, autoGainControl,
        ...(deviceId ? { deviceId: { exact: deviceId } } : {}),
      },
    });
    try {
      await this._opening;
    } finally {
      this._opening = null;
    }
  }

  /** Stop capturing and tell the server the audio stream ended (`audio.end`). */
  stopMicrophone() {
    const capture = this._capture;
    if (!capture) return;
    this._capture = null;
    capture.node.port.postMessage({ type: "stop" });
    capture.source.disconnect();
    capture.stream.getTracks().forEach((t) => t.stop());
    capture.context.close();
    this._send({ type: "audio.end" });
    this._setState({ microphone: false, microphoneGated: false });
  }

  /**
   * Half duplex (true): the microphone is muted while the agent is audible, so
   * it cannot hear itself through speakers. Full duplex (false): for
   * headphones; talking over the agent interrupts it.
   */
  setHalfDuplex(on) {
    this.halfDuplex = Boolean(on);
    if (!this.halfDuplex) this._setState({ microphoneGated: false });
  }

  /**
   * Show the agent the camera: about one JPEG a second, at most 768 px on the
   * long side, sized to the server's limit. Resolves with the MediaStream (for
   * a preview); rejects with a LiveError `camera_unavailable`.
   */
  async startCamera({ deviceId, fps = 1, longSide = 768 } = {}) {
    const video = { width: { ideal: 1280 }, height: { ideal: 720 }, ...(deviceId ? { deviceId: { exact: deviceId } } : {}) };
    return this._startVideo("camera", () => navigator.mediaDevices.getUserMedia({ video }), { fps, longSide });
  }

  /**
   * Show the agent a screen, window or tab the user picks (call from a click).
   * Resolves with the MediaStream; rejects with a LiveError `screen_unavailable`.
   * When the user stops sharing from the browser's own controls, video stops
   * and "state" reports it.
   */
  async startScreen({ fps = 1, longSide = 768 } = {}) {
    return this._startVideo("screen", () => navigator.mediaDevices.getDisplayMedia({ video: true, audio: false }), { fps, longSide });
  }

  /** Stop sending camera or screen frames. */
  stopVideo() {
    const capture = this._videoCapture;
    if (!capture) return;
    this._videoCapture = null;
    capture.stop();
    this._setState({ video: null });
  }

  async _startVideo(source, open, { fps, longSide }) {
    if (!this._ws) throw new LiveError("not_connected", `connect() before start${source === "camera" ? "Camera" : "Screen"}()`, false);
    let stream;
    try {
      stream = await open();
    } catch (error) {
      const err = new LiveError(`${source}_unavailable`, `no ${source}: ${error.message || error.name}`, false);
      this._emit("error", { type: "error", code: err.code, message: err.message, fatal: false });
      throw err;
    }
    this.stopVideo();
    const limits = (this.session && this.session.image) || {};
    const capture = new VideoCapture(stream, {
      send: (frame) => {
        const ws = this._ws;
        if (!ws || ws.readyState !== WebSocket.OPEN) return false;
        ws.send(frame);
        return true;
      },
      backlog: () => (this._ws ? this._ws.bufferedAmount : 0),
      maxBytes: limits.max_bytes || undefined,
      fps: Math.min(fps, limits.max_rate || fps),
      longSide,
      onEnded: () => { if (this._videoCapture === capture) this.stopVideo(); },
    });
    this._videoCapture = capture;
    this._videoStats = capture.stats;
    try {
      await capture.start();
    } catch (error) {
      this.stopVideo();
      throw new LiveError(`${source}_unavailable`, `the ${source} does not play: ${error.message || error}`, false);
    }
    this._setState({ video: source });
    return stream;
  }

  /** A typed user turn. */
  sendText(text) {
    this._send({ type: "text", text });
    this._lastSpeechAt = performance.now(); // the reply's latency is timed from here
  }

  /** Manual turn-taking, for push-to-talk pages. */
  activityStart() {
    this._send({ type: "activity.start" });
  }

  activityEnd() {
    this._send({ type: "activity.end" });
  }

  /** Stop the reply now, on this side (the server keeps its own state). */
  flushPlayback() {
    if (!this._playback) return null;
    this._counters.flushes++;
    const id = ++this._flushId;
    this._playback.node.port.postMessage({ type: "flush", id });
    return id;
  }

  /**
   * End the session: `session.close`, then the socket, microphone and speaker.
   * Also cancels a connect() or startMicrophone() still under way.
   */
  async close() {
    const ws = this._ws;
    this._epoch++;
    this.stopMicrophone();
    if (ws && ws.readyState === WebSocket.OPEN && this.state.connection !== "connecting") {
      this._setState({ connection: "closing" });
      ws.send(JSON.stringify({ type: "session.close" }));
      await new Promise((resolve) => {
        const timer = setTimeout(() => { ws.close(); resolve(); }, 2000);
        ws.addEventListener("close", () => { clearTimeout(timer); resolve(); });
      });
    } else if (ws) {
      ws.close();
    }
    if (this._ws === ws) this._teardown();
  }

  /**
   * How loud each side is now, for a meter: `microphone` (what the microphone
   * hears, whether or not it is sent) and `agent` (what is playing), each 0
   * (silence, -60 dBFS or quieter) to 1 (full scale), on a decibel scale.
   */
  levels() {
    const now = performance.now();
    const l = this._levels;
    const scale = (rms, at) => (now - at > LEVEL_STALE_MS || rms <= 0 ? 0 : Math.max(0, Math.min(1, 1 + (20 * Math.log10(rms)) / 60)));
    return { microphone: scale(l.microphone, l.microphoneAt), agent: scale(l.agent, l.agentAt) };
  }

  /**
   * Counters for tests and meters: frames and bytes sent, samples received,
   * played and still queued (24 kHz samples), flushes, underruns.
   */
  stats() {
    return {
      ...this._counters,
      playing: this.state.agentSpeaking,
      video: this._videoStats ? { ...this._videoStats } : null,
      captureRate: this._capture ? this._capture.context.sampleRate : null,
      playbackRate: this._playback ? this._playback.context.sampleRate : null,
    };
  }

  // ------------------------------------------------------------------ internals

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  /** Dispatch an error as an "error" event, once, and return it (to throw). */
  _report(error) {
    if (!error.reported) {
      error.reported = true;
      this._emit("error", { type: "error", code: error.code, message: error.message, fatal: error.fatal });
    }
    return error;
  }

  _setState(change) {
    const next = { ...this.state, ...change };
    if (Object.keys(change).every((k) => this.state[k] === next[k])) return;
    this.state = next;
    this._emit("state", { ...next });
  }

  _send(message) {
    if (this._ws && this._ws.readyState === WebSocket.OPEN) this._ws.send(JSON.stringify(message));
  }

  async _openMicrophone(epoch, constraints) {
    const cancelled = () => new LiveError("cancelled", "the session was ended while the microphone was being opened", false);
    const insecure = insecureContextMessage();
    if (insecure) throw this._report(new LiveError("insecure_context", insecure));
    // Both audio contexts are made (or resumed) here, before the first await:
    // still inside the caller's click. Safari, and Firefox with a strict
    // autoplay policy, let audio start only while a user gesture is handled.
    this._preparePlayback();
    let context = null;
    try {
      context = new AudioContext({ sampleRate: INPUT_RATE, latencyHint: "interactive" });
    } catch {
      // A browser without 16 kHz contexts: one at the device's rate, made once the device is open.
    }
    const release = () => {
      if (context) context.close();
      // Nothing connected or connecting: the speaker made for this click goes too.
      if (!this._ws && this._playback && this.state.connection !== "connecting") this._closePlayback();
    };
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia(constraints);
    } catch (error) {
      release();
      if (epoch !== this._epoch) throw cancelled();
      throw this._report(microphoneError(error));
    }
    const stop = () => stream.getTracks().forEach((t) => t.stop());
    // The user may have ended the session while the permission prompt was open.
    if (epoch !== this._epoch) {
      stop();
      release();
      throw cancelled();
    }
    let capture;
    const first = context;
    context = null; // from here _startCapture closes it unless it returns it
    try {
      capture = await this._startCapture(stream, first);
    } catch (error) {
      stop();
      release();
      if (epoch !== this._epoch) throw cancelled();
      throw this._report(new LiveError(
        "microphone_unavailable", `the microphone could not be connected (${error.name}: ${error.message})`, false,
      ));
    }
    if (epoch !== this._epoch) {
      stop();
      capture.context.close();
      release();
      throw cancelled();
    }
    this._capture = capture;
    this._setState({ microphone: true });
  }

  /**
   * A capture graph on `first` (a 16 kHz context, or null); where the browser
   * refuses to connect a microphone to a context at a rate other than the
   * device's (NotSupportedError), one at the device's rate, and the worklet
   * resamples. Closes every context it does not return.
   */
  async _startCapture(stream, first) {
    let lastError = null;
    for (const sampleRate of [INPUT_RATE, undefined]) {
      let context = sampleRate ? first : null;
      if (sampleRate && !context) continue;
      try {
        context = context || new AudioContext({ latencyHint: "interactive" });
      } catch (error) {
        lastError = error;
        continue;
      }
      try {
        await context.audioWorklet.addModule(new URL("./capture-worklet.js", import.meta.url));
        const source = context.createMediaStreamSource(stream);
        const node = new AudioWorkletNode(context, "live-capture", {
          numberOfInputs: 1, numberOfOutputs: 0, channelCount: 1, channelCountMode: "explicit",
          processorOptions: { targetRate: INPUT_RATE, frameMs: this.frameMs },
        });
        node.port.onmessage = (event) => this._sendFrame(event.data);
        source.connect(node);
        await context.resume();
        return { context, node, source, stream };
      } catch (error) {
        context.close();
        lastError = error;
        if (!sampleRate || error.name !== "NotSupportedError") throw error;
      }
    }
    throw lastError;
  }

  /** Whether the microphone may be sent now (the half-duplex gate). */
  _gateOpen() {
    if (!this.halfDuplex) return true;
    const now = performance.now();
    const c = this._counters;
    if (this.state.agentSpeaking || c.queuedSamples > 0) this._lastAudibleAt = now;
    const context = this._playback && this._playback.context;
    const latencyMs = context ? 1000 * ((context.outputLatency || 0) + (context.baseLatency || 0)) : 0;
    const open = now - this._lastAudibleAt >= this.gateTailMs + latencyMs;
    if (open === this.state.microphoneGated) {
      // The model should not wait for the rest of an utterance cut by the gate.
      if (!open) this._send({ type: "audio.end" });
      this._setState({ microphoneGated: !open });
    }
    return open;
  }

  /** The level of one microphone frame; a loud one marks the user speaking. */
  _measureFrame(buffer) {
    const pcm = new Int16Array(buffer);
    let energy = 0;
    for (let i = 0; i < pcm.length; i++) energy += pcm[i] * pcm[i];
    const rms = pcm.length ? Math.sqrt(energy / pcm.length) / 32768 : 0;
    this._levels.microphone = rms;
    this._levels.microphoneAt = performance.now();
    return rms >= SPEECH_LEVEL;
  }

  _sendFrame(buffer) {
    const ws = this._ws;
    const speech = this._measureFrame(buffer);
    if (this.state.connection === "idle" || this.state.connection === "connecting") {
      // Said between allowing the microphone and the session starting: held
      // (up to EARLY_FRAMES_LIMIT, oldest dropped) and sent once it starts.
      if (this._early.length >= EARLY_FRAMES_LIMIT) this._early.shift();
      this._early.push(buffer);
      if (speech) this._lastSpeechAt = performance.now();
      return;
    }
    if (!ws || ws.readyState !== WebSocket.OPEN) return;
    if (!this._gateOpen()) {
      this._counters.framesGated++;
      return;
    }
    // A socket that cannot keep up (about 2 s queued) drops frames rather than growing.
    if (ws.bufferedAmount > INPUT_RATE * 2 * 2) return;
    ws.send(buffer);
    this._counters.framesSent++;
    this._counters.bytesSent += buffer.byteLength;
    if (speech) this._lastSpeechAt = performance.now();
  }

  /** The speaker: made once per session, from a click; resumed when it already exists. */
  _preparePlayback() {
    if (this._playback) {
      this._playback.context.resume();
      return;
    }
    let context;
    try {
      context = new AudioContext({ sampleRate: OUTPUT_RATE, latencyHint: "interactive" });
    } catch {
      context = new AudioContext({ latencyHint: "interactive" }); // the worklet resamples
    }
    const ready = context.audioWorklet
      .addModule(new URL("./playback-worklet.js", import.meta.url))
      .then(() => {
        const node = new AudioWorkletNode(context, "live-playback", {
          numberOfInputs: 0, numberOfOutputs: 1, outputChannelCount: [1],
          processorOptions: { prebufferMs: this.prebufferMs },
        });
        node.port.onmessage = (event) => this._onPlaybackStats(event.data);
        node.connect(context.destination);
        return node;
      });
    const pending = [];
    const playback = { context, node: null, ready, pending };
    this._playback = playback;
    // Until the worklet is loaded, audio waits here (a few ms at most; bounded:
    // past the limit the oldest chunk is dropped and counted).
    playback.node = {
      port: {
        postMessage: (msg, transfer) => {
          if (pending.length >= PENDING_PLAYBACK_LIMIT) {
            pending.shift();
            this._counters.playbackDropped++;
          }
          pending.push([msg, transfer]);
        },
      },
    };
    ready.then(
      (node) => {
        if (this._playback !== playback) return;
        playback.node = node;
        for (const [msg, transfer] of pending) node.port.postMessage(msg, transfer);
        pending.length = 0;
      },
      (error) => {
        if (this._playback !== playback) return; // closed meanwhile
        // Without the worklet there is no speaker: say so, and drop reply audio.
        pending.length = 0;
        playback.failed = true;
        playback.node = { port: { postMessage: () => {} } };
        this._report(new LiveError(
          "playback_unavailable", `the agent's voice cannot be played here (${error.name}: ${error.message})`, false,
        ));
      },
    );
    context.resume();
  }

  _onPlaybackStats(msg) {
    if (msg.type !== "stats") return;
    const report = this._playbackReport;
    if (report && msg.flushId === report.id) {
      this._playbackReport = null;
      const played = Math.max(0, report.received - msg.dropped) / OUTPUT_RATE;
      this._send({ type: "playback", played });
    }
    const c = this._counters;
    c.samplesPlayed = msg.played;
    c.queuedSamples = msg.queued;
    c.samplesFlushed = msg.flushed;
    c.underruns = msg.underruns;
    if (msg.playing || msg.queued > 0) this._lastAudibleAt = performance.now();
    this._levels.agent = msg.level || 0;
    this._levels.agentAt = performance.now();
    this._setState({ agentSpeaking: msg.playing });
  }

  _onMessage(data) {
    if (typeof data !== "string") {
      this._lastSeq++; // each audio frame of the stream counts one
      this._tails.audio(); // a new reply: what the last one held is read first
      this._counters.samplesReceived += data.byteLength / 2;
      this._replySamples += data.byteLength / 2;
      if (!this._replyOpen) this._replyStarted();
      if (!this._playback || this._playback.failed) {
        this._counters.playbackDropped++; // nothing can play it; it must not mute the microphone
        return;
      }
      this._lastAudibleAt = performance.now();
      this._playback.node.port.postMessage(data, [data]);
      return;
    }
    let msg;
    try {
      msg = JSON.parse(data);
    } catch {
      return;
    }
    if (typeof msg.seq === "number") this._lastSeq = msg.seq;
    switch (msg.type) {
      case "turn.interrupted": {
        // Played = what this reply brought, less what the flush dropped (from the worklet).
        const received = this._replySamples;
        this._replySamples = 0;
        this._replyOpen = false;
        const id = this.flushPlayback();
        if (id === null) this._send({ type: "playback", played: 0 });
        else this._playbackReport = { id, received };
        break;
      }
      case "generation.complete":
      case "turn.complete":
        if (msg.type === "turn.complete") {
          this._replySamples = 0;
          this._replyOpen = false;
        }
        // A turn can end without generation.complete (the model's connection
        // was lost): its tail must still play rather than wait for the next reply.
        if (this._playback) this._playback.node.port.postMessage({ type: "end" });
        break;
      case "tool.call":
        if (msg.runs_on === "client") this._runTool(msg);
        break;
      case "tool.cancelled":
        for (const id of msg.ids || []) this._pendingTools.delete(id);
        break;
      case "session.reconnecting":
        this._setState({ connection: "reconnecting" });
        break;
      case "session.resumed":
        this._setState({ connection: "open" });
        break;
      case "session.closed":
        this._closedByServer = true;
        break;
    }
    if (SERVER_EVENTS.includes(msg.type)) this._tails.feed(msg);
  }

  /**
   * The first audio of a reply: dispatch "reply.latency" with the seconds since
   * the end of the user's speech (their last loud frame sent) or typed turn.
   */
  _replyStarted() {
    this._replyOpen = true;
    if (this._lastSpeechAt === null) return;
    const seconds = (performance.now() - this._lastSpeechAt) / 1000;
    this._lastSpeechAt = null;
    this._emit("reply.latency", { type: "reply.latency", seconds });
  }

  async _runTool(call) {
    this._pendingTools.add(call.id);
    const handler = this.tools[call.name];
    let response;
    try {
      if (!handler) throw new Error(`this page has no handler for ${call.name}`);
      response = await handler(call.args || {}, call);
      if (response === undefined || response === null || typeof response !== "object" || Array.isArray(response)) {
        response = { result: response ?? null };
      }
    } catch (error) {
      response = { error: String(error && error.message ? error.message : error) };
    }
    if (!this._pendingTools.delete(call.id)) return; // cancelled meanwhile
    this._send({ type: "tool.result", id: call.id, name: call.name, response });
  }

  _onClose(event) {
    const token = this.session && this.session.resume_token;
    if (!this._closedByServer && this.state.connection !== "closing" && token) {
      this._reattach(event.code); // the conversation goes on over a new socket
      return;
    }
    if (!this._closedByServer && this.state.connection !== "closing") {
      this._emit("error", {
        type: "error", code: "connection_lost", fatal: true,
        message: `the connection to the server was lost (code ${event.code})`,
      });
    }
    this._teardown();
  }

  /**
   * The socket dropped without session.closed: open a new one and take the
   * session over (session.resume with the last sequence number received), with
   * backoff, for up to 30 s. Dispatches "reattaching" before each attempt and
   * the server's "session.reattached" on success; the microphone and playback
   * keep running meanwhile (audio said while away is dropped).
   */
  async _reattach(code) {
    this._tails.flush(); // what the dropped socket brought is read before the news
    const epoch = this._epoch;
    const started = performance.now();
    this._ws = null;
    this._setState({ connection: "reattaching" });
    for (let attempt = 1; performance.now() - started < REATTACH_FOR_MS; attempt++) {
      const delay = REATTACH_DELAYS_MS[Math.min(attempt - 1, REATTACH_DELAYS_MS.length - 1)];
      this._emit("reattaching", { type: "reattaching", attempt, delay: delay / 1000, code });
      await new Promise((resolve) => setTimeout(resolve, delay));
      if (epoch !== this._epoch || this.state.connection !== "reattaching") return; // ended meanwhile
      let token;
      try {
        token = typeof this._tokenSource === "function" ? await this._tokenSource() : this._tokenSource;
      } catch (error) {
        continue; // no token now: the next attempt asks again
      }
      if (epoch !== this._epoch || this.state.connection !== "reattaching") return;
      const outcome = await this._resumeOn(new WebSocket(this._url), token);
      if (epoch !== this._epoch) {
        if (outcome.ws) outcome.ws.close();
        return;
      }
      if (outcome.ws) {
        const ws = outcome.ws;
        this._ws = ws;
        // Frames the server no longer had are numbered all the same: count them,
        // or the next drop would replay what the user already heard.
        this._lastSeq += outcome.message.missed || 0;
        // The resume token just used works no more; the next came with this message.
        if (outcome.message.resume_token) this.session = { ...this.session, resume_token: outcome.message.resume_token };
        ws.addEventListener("message", (event) => { if (this._ws === ws) this._onMessage(event.data); });
        ws.addEventListener("close", (event) => { if (this._ws === ws) this._onClose(event); });
        this._setState({ connection: "open" });
        this._emit("session.reattached", outcome.message);
        return;
      }
      if (outcome.fatal) {
        this._report(new LiveError(outcome.fatal.code, outcome.fatal.message, true));
        this._teardown();
        return;
      }
    }
    this._report(new LiveError("connection_lost", `the connection to the server was lost (code ${code}) and could not be restored`, true));
    this._teardown();
  }

  /** One attempt: resolves with {ws, message} once reattached, {fatal} when refused for good, or {} to try again. */
  _resumeOn(ws, token) {
    ws.binaryType = "arraybuffer";
    return new Promise((resolve) => {
      const done = (outcome) => {
        clearTimeout(timer);
        ws.removeEventListener("message", onMessage);
        ws.removeEventListener("close", onClose);
        resolve(outcome);
      };
      const onMessage = (event) => {
        const msg = textEvent(event);
        if (!msg) return;
        if (msg.type === "session.reattached") done({ ws, message: msg });
        else if (msg.type === "error" && ["session_expired", "unauthorized"].includes(msg.code)) {
          ws.close();
          done({ fatal: msg });
        }
      };
      const onClose = () => done({});
      const timer = setTimeout(() => { ws.close(); done({}); }, 10000);
      ws.addEventListener("message", onMessage);
      ws.addEventListener("close", onClose);
      ws.addEventListener("open", () => {
        const resume = {
          type: "session.resume",
          session_id: this.session.session_id,
          resume_token: this.session.resume_token,
          last_seq: this._lastSeq,
        };
        if (token) resume.token = token;
        ws.send(JSON.stringify(resume));
      });
    });
  }

  _closePlayback() {
    if (!this._playback) return;
    this._playback.context.close();
    this._playback = null;
  }

  _teardown() {
    this._tails.flush();
    this._epoch++;
    this._early = [];
    this.stopMicrophone();
    this.stopVideo();
    this._closePlayback();
    this._ws = null;
    this._pendingTools.clear();
    this._lastAudibleAt = -Infinity;
    this._lastSpeechAt = null;
    this._replyOpen = false;
    this._setState({ connection: "closed", microphone: false, agentSpeaking: false, microphoneGated: false });
  }
}
