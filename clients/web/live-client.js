// LiveClient: the browser side of the live session protocol (docs/protocol.md).
//
//   import { LiveClient } from "/client/live-client.js";
//   const live = new LiveClient({ tools: { get_time: () => ({ now: Date.now() }) } });
//   live.addEventListener("transcript.output", (e) => show(e.detail.text));
//   await live.connect();            // same-origin ws(s)://HOST/live by default
//   await live.startMicrophone();    // call from a click: browsers unlock audio on a gesture
//   await live.startCamera();        // or startScreen(): about a JPEG a second; stopVideo()
//
// No dependencies. The microphone is captured by an AudioWorklet at 16 kHz and
// sent as 20 ms PCM16 binary frames; the agent's 24 kHz replies play through a
// second AudioWorklet with a 100 ms prebuffer, flushed at once on
// `turn.interrupted`. Every server event is re-dispatched as a CustomEvent of
// the same type with the message as `detail`; "state" reports the connection,
// the microphone and whether the agent is audible. The Gemini key never reaches
// the page: the server holds it.

import { VideoCapture } from "./video-capture.js";

const INPUT_RATE = 16000;
const OUTPUT_RATE = 24000;

const SERVER_EVENTS = [
  "session.started", "transcript.input", "transcript.output", "text", "tool.call",
  "tool.result", "tool.cancelled", "turn.interrupted", "generation.complete",
  "turn.complete", "usage", "session.go_away", "session.reconnecting",
  "session.resumed", "error", "session.closed",
];

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

export class LiveClient extends EventTarget {
  /**
   * @param {object} [options]
   * @param {Object<string, function(object, object): any>} [options.tools] handlers for
   *   client-run tools: name -> (args, call) => response (a JSON object, or a promise of one)
   * @param {number} [options.prebufferMs] reply audio held before playback starts (100)
   * @param {number} [options.frameMs] microphone frame length, 20-40 ms (20)
   */
  constructor({ tools = {}, prebufferMs = 100, frameMs = 20 } = {}) {
    super();
    this.tools = { ...tools };
    this.prebufferMs = prebufferMs;
    this.frameMs = frameMs;
    this.session = null;
    this.state = { connection: "idle", microphone: false, agentSpeaking: false };
    this._ws = null;
    this._capture = null; // { context, node, source, stream }
    this._playback = null; // { context, node }
    this._closedByServer = false;
    this._pendingTools = new Set();
    this._replySamples = 0; // reply audio received since the last turn boundary
    this._flushId = 0;
    this._playbackReport = null; // { id, received } while a flush's count is awaited
    this._counters = {
      framesSent: 0, bytesSent: 0, samplesReceived: 0, flushes: 0,
      samplesPlayed: 0, queuedSamples: 0, samplesFlushed: 0, underruns: 0,
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
   * message; rejects with a LiveError (`unauthorized`, `capacity`, ...).
   * `token` is a string, or a function returning one (or a promise of one),
   * called on every connect: the hook to fetch a fresh short-lived token
   * from the app's backend, so no secret ever lives in the page.
   */
  async connect(url = defaultUrl(), { token, history } = {}) {
    if (this._ws) throw new LiveError("already_connected", "this client is already connected", false);
    this._setState({ connection: "connecting" });
    this._preparePlayback(); // inside the caller's click, so the browser lets it play
    if (typeof token === "function") {
      try {
        token = await token();
      } catch (error) {
        this._setState({ connection: "closed" });
        const failure = new LiveError("token_unavailable", `could not get a session token: ${error.message || error}`, true);
        this._emit("error", { type: "error", code: failure.code, message: failure.message, fatal: true });
        throw failure;
      }
    }
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    this._ws = ws;
    this._closedByServer = false;
    const started = new Promise((resolve, reject) => {
      let refusal = null;
      const onMessage = (event) => {
        if (typeof event.data !== "string") return;
        const msg = JSON.parse(event.data);
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
      const cleanup = () => {
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
    } catch (error) {
      this._ws = null;
      this._setState({ connection: "closed" });
      this._emit("error", { type: "error", code: error.code, message: error.message, fatal: true });
      throw error;
    }
    ws.addEventListener("message", (event) => this._onMessage(event.data));
    ws.addEventListener("close", (event) => this._onClose(event));
    this._setState({ connection: "open" });
    this._emit("session.started", this.session);
    return this.session;
  }

  /**
   * Capture the microphone and stream it. The constraints default to the
   * browser's echo cancellation, noise suppression and gain control, which is
   * what lets the agent be heard through speakers without hearing itself.
   */
  async startMicrophone({ deviceId, echoCancellation = true, noiseSuppression = true, autoGainControl = true } = {}) {
    if (this._capture) return;
    if (!this._ws) throw new LiveError("not_connected", "connect() before startMicrophone()", false);
    if (this._playback) this._playback.context.resume();
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({
        audio: {
          channelCount: 1, echoCancellation, noiseSuppression, autoGainControl,
          ...(deviceId ? { deviceId: { exact: deviceId } } : {}),
        },
      });
    } catch (error) {
      const err = new LiveError("microphone_unavailable", `no microphone: ${error.message || error.name}`, false);
      this._emit("error", { type: "error", code: err.code, message: err.message, fatal: false });
      throw err;
    }
    let context;
    try {
      context = new AudioContext({ sampleRate: INPUT_RATE, latencyHint: "interactive" });
    } catch {
      context = new AudioContext({ latencyHint: "interactive" }); // the worklet resamples
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
      this._capture = { context, node, source, stream };
    } catch (error) {
      stream.getTracks().forEach((t) => t.stop());
      context.close();
      throw error;
    }
    this._setState({ microphone: true });
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
    this._setState({ microphone: false });
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

  /** End the session: `session.close`, then the socket, microphone and speaker. */
  async close() {
    const ws = this._ws;
    this.stopMicrophone();
    if (ws && ws.readyState === WebSocket.OPEN) {
      this._setState({ connection: "closing" });
      ws.send(JSON.stringify({ type: "session.close" }));
      await new Promise((resolve) => {
        const timer = setTimeout(() => { ws.close(); resolve(); }, 2000);
        ws.addEventListener("close", () => { clearTimeout(timer); resolve(); });
      });
    }
    this._teardown();
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

  _setState(change) {
    const next = { ...this.state, ...change };
    if (Object.keys(change).every((k) => this.state[k] === next[k])) return;
    this.state = next;
    this._emit("state", { ...next });
  }

  _send(message) {
    if (this._ws && this._ws.readyState === WebSocket.OPEN) this._ws.send(JSON.stringify(message));
  }

  _sendFrame(buffer) {
    const ws = this._ws;
    if (!ws || ws.readyState !== WebSocket.OPEN) return;
    // A socket that cannot keep up (about 2 s queued) drops frames rather than growing.
    if (ws.bufferedAmount > INPUT_RATE * 2 * 2) return;
    ws.send(buffer);
    this._counters.framesSent++;
    this._counters.bytesSent += buffer.byteLength;
  }

  _preparePlayback() {
    if (this._playback) return;
    let context;
    try {
      context = new AudioContext({ sampleRate: OUTPUT_RATE, latencyHint: "interactive" });
    } catch {
      context = new AudioContext({ latencyHint: "interactive" }); // the worklet interpolates
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
    this._playback = { context, node: null, ready, pending };
    // Until the worklet is loaded, audio waits here (a few ms at most).
    this._playback.node = {
      port: { postMessage: (msg, transfer) => pending.push([msg, transfer]) },
    };
    ready.then((node) => {
      if (!this._playback || this._playback.context !== context) return;
      this._playback.node = node;
      for (const [msg, transfer] of pending) node.port.postMessage(msg, transfer);
      pending.length = 0;
    });
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
    this._setState({ agentSpeaking: msg.playing });
  }

  _onMessage(data) {
    if (typeof data !== "string") {
      this._counters.samplesReceived += data.byteLength / 2;
      this._replySamples += data.byteLength / 2;
      if (this._playback) this._playback.node.port.postMessage(data, [data]);
      return;
    }
    let msg;
    try {
      msg = JSON.parse(data);
    } catch {
      return;
    }
    switch (msg.type) {
      case "turn.interrupted": {
        // Played = what this reply brought, less what the flush dropped (from the worklet).
        const received = this._replySamples;
        this._replySamples = 0;
        const id = this.flushPlayback();
        if (id === null) this._send({ type: "playback", played: 0 });
        else this._playbackReport = { id, received };
        break;
      }
      case "turn.complete":
        this._replySamples = 0;
        break;
      case "generation.complete":
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
    if (SERVER_EVENTS.includes(msg.type)) this._emit(msg.type, msg);
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
    if (!this._closedByServer && this.state.connection !== "closing") {
      this._emit("error", {
        type: "error", code: "connection_lost", fatal: true,
        message: `the connection to the server was lost (code ${event.code})`,
      });
    }
    this._teardown();
  }

  _teardown() {
    this.stopMicrophone();
    this.stopVideo();
    if (this._playback) {
      this._playback.context.close();
      this._playback = null;
    }
    this._ws = null;
    this._pendingTools.clear();
    this._setState({ connection: "closed", microphone: false, agentSpeaking: false });
  }
}
