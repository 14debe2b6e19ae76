// LateTails: a reply's late transcript tails folded into the reply, as a page reads it.
//
// Gemini does not order transcripts with the model's turn: the last words of a
// reply may arrive after its final transcript, even after its `turn.complete`,
// as `transcript.output` with `late: true`. A page that shows each final and
// marks the turn's end would show the reply cut short.
//
// LateTails holds a reply's final transcript until its turn is over, appends
// each late tail that arrives meanwhile, and lets the final and `turn.complete`
// go once the tail has come, or `waitMs` after `turn.complete` when none comes,
// or at once when anything else arrives (the next reply's audio, the user's
// words, a tool call). Everything else passes through in order (generation.complete
// at once: a player must not wait for text). A tail later
// than that still comes as it was sent, `late: true`, for the page to append
// to the last reply. The same rules as the Python client's (clients/tails.py).

export const LATE_TAIL_WAIT_MS = 300;

// What may come between a reply's final transcript and its turn's end: held
// with the final, so the order stays as sent. Not generation.complete: it says
// the reply's audio is all there, and a player must not wait for text.
const TURN_END = new Set(["usage"]);

function isReplyFinal(msg) {
  return msg.type === "transcript.output" && msg.final && !msg.heard && !msg.late;
}

export class LateTails {
  /**
   * @param {function(object): void} emit receives each message when the page may read it
   * @param {number|null} [waitMs] how long to wait after turn.complete for a tail (null: pass all at once)
   */
  constructor(emit, waitMs = LATE_TAIL_WAIT_MS) {
    this._emit = emit;
    this.waitMs = waitMs;
    this._held = [];
    this._timer = null;
  }

  /** A server event arrived. */
  feed(msg) {
    if (this.waitMs === null) {
      this._emit(msg);
      return;
    }
    const held = this._held;
    if (!held.length) {
      if (isReplyFinal(msg)) held.push({ ...msg });
      else this._emit(msg);
      return;
    }
    if (msg.type === "transcript.output" && msg.late) {
      held[0].text += msg.text;
      if (this._timer !== null) this.flush(); // the tail after turn.complete came: the turn is whole
      return;
    }
    if (msg.type === "generation.complete") {
      this._emit(msg);
      return;
    }
    if (TURN_END.has(msg.type)) {
      held.push(msg);
      return;
    }
    if (msg.type === "turn.complete" && this._timer === null) {
      held.push(msg);
      this._timer = setTimeout(() => this.flush(), this.waitMs);
      return;
    }
    this.flush();
    this.feed(msg);
  }

  /** Reply audio arrived: a new reply began, so what is held goes first. */
  audio() {
    if (this._held.length) this.flush();
  }

  /** Everything held, now, in order. */
  flush() {
    if (this._timer !== null) clearTimeout(this._timer);
    this._timer = null;
    const held = this._held;
    this._held = [];
    for (const msg of held) this._emit(msg);
  }

  /** Drop what is held (the session is gone). */
  clear() {
    if (this._timer !== null) clearTimeout(this._timer);
    this._timer = null;
    this._held = [];
  }
}
