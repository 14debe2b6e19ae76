// VideoCapture: frames of a camera or a shared screen, as JPEG `image` messages.
//
// Used by LiveClient.startCamera() / startScreen() / stopVideo(); no
// dependencies. A frame is drawn from the stream into a canvas at most
// `longSide` pixels on its long side (768: what the model works at), encoded
// as JPEG, and sent as {"type": "image", "mime_type": "image/jpeg", "data":
// base64} (docs/protocol.md). The server announces how large an image may be
// (`session.started`'s `image.max_bytes`): a frame over it is encoded again at a
// lower quality, then a smaller size, until it fits. About one frame a second
// (the model samples about one); the next frame is timed from the end of the
// previous one, so a slow encoder never piles frames up, and a frame is skipped
// while the socket still has a backlog, so audio is never held up behind video.

const QUALITIES = [0.7, 0.55, 0.4, 0.3];
const SOCKET_BACKLOG = 128 * 1024; // bytes queued on the socket: skip a frame beyond this

export class VideoCapture {
  /**
   * @param {MediaStream} stream a camera (getUserMedia) or screen (getDisplayMedia) stream
   * @param {object} options
   * @param {function(string): boolean} options.send sends one text frame; false if it could not
   * @param {function(): number} options.backlog bytes still queued on the socket
   * @param {number} [options.maxBytes] largest image the server takes
   * @param {number} [options.fps] frames a second (1)
   * @param {number} [options.longSide] pixels on the long side at most (768)
   * @param {function(): void} [options.onEnded] the stream ended (the user stopped sharing)
   */
  constructor(stream, { send, backlog, maxBytes = 48 * 1024, fps = 1, longSide = 768, onEnded = () => {} }) {
    this.stream = stream;
    this._send = send;
    this._backlog = backlog;
    this.maxBytes = maxBytes;
    this.intervalMs = 1000 / fps;
    this.longSide = longSide;
    this._onEnded = onEnded;
    this._timer = null;
    this._stopped = false;
    this.stats = { imagesSent: 0, imageBytesSent: 0, imagesSkipped: 0, lastImage: null };
    for (const track of stream.getVideoTracks()) track.addEventListener("ended", () => this._ended());
  }

  async start() {
    const video = document.createElement("video");
    video.muted = true;
    video.playsInline = true;
    video.srcObject = this.stream;
    await video.play();
    if (!video.videoWidth) {
      await new Promise((resolve) => video.addEventListener("loadedmetadata", resolve, { once: true }));
    }
    this._video = video;
    this._tick();
  }

  stop() {
    if (this._stopped) return;
    this._stopped = true;
    clearTimeout(this._timer);
    this.stream.getTracks().forEach((t) => t.stop());
    if (this._video) this._video.srcObject = null;
  }

  _ended() {
    if (this._stopped) return;
    this.stop();
    this._onEnded();
  }

  async _tick() {
    if (this._stopped) return;
    const began = performance.now();
    try {
      if (this._backlog() > SOCKET_BACKLOG) this.stats.imagesSkipped++;
      else await this._sendFrame();
    } catch (error) {
      this.stats.imagesSkipped++;
      console.warn("video frame not sent:", error);
    }
    if (this._stopped) return;
    const wait = Math.max(0, this.intervalMs - (performance.now() - began));
    this._timer = setTimeout(() => this._tick(), wait);
  }

  async _sendFrame() {
    const video = this._video;
    const w = video.videoWidth, h = video.videoHeight;
    if (!w || !h) return;
    let scale = Math.min(1, this.longSide / Math.max(w, h));
    for (let attempt = 0; attempt < 4; attempt++) {
      const width = Math.max(1, Math.round(w * scale)), height = Math.max(1, Math.round(h * scale));
      const canvas = makeCanvas(width, height);
      canvas.getContext("2d").drawImage(video, 0, 0, width, height);
      for (const quality of QUALITIES) {
        const blob = await encodeJpeg(canvas, quality);
        if (blob.size <= this.maxBytes) {
          const data = await base64Of(blob);
          if (this._stopped) return;
          if (!this._send(JSON.stringify({ type: "image", mime_type: "image/jpeg", data }))) return;
          this.stats.imagesSent++;
          this.stats.imageBytesSent += blob.size;
          this.stats.lastImage = { width, height, bytes: blob.size, quality };
          return;
        }
      }
      scale *= 0.7; // the lowest quality was still too large: a smaller picture
    }
    this.stats.imagesSkipped++;
  }
}

function makeCanvas(width, height) {
  if (typeof OffscreenCanvas !== "undefined") return new OffscreenCanvas(width, height);
  const canvas = document.createElement("canvas");
  canvas.width = width;
  canvas.height = height;
  return canvas;
}

function encodeJpeg(canvas, quality) {
  if (canvas.convertToBlob) return canvas.convertToBlob({ type: "image/jpeg", quality });
  return new Promise((resolve, reject) =>
    canvas.toBlob((blob) => (blob ? resolve(blob) : reject(new Error("JPEG encoding failed"))), "image/jpeg", quality),
  );
}

function base64Of(blob) {
  // The browser's own encoder: a data: URL, without its prefix.
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).slice(String(reader.result).indexOf(",") + 1));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(blob);
  });
}
