"""The client's side of one session: its socket, the opening, the two pumps, reattach.

A session has at most one client socket at a time. Before the session starts,
`await_opening` reads the door's opening (with the client's credential, checked
here). While it runs, `read_client` feeds what the client sends to the session
and `write_client` sends the session's stream, numbered and kept for a replay.
When the socket drops without `session.close` or a normal close (1000) and
the door can reattach, the session goes on without a socket for the reattach
grace; a new socket that brings the session's resume token (and, when the
server requires tokens, one for the same subject) takes it over (`attach`),
first gets what it missed, and a new resume token: each works once.
"""

from __future__ import annotations

import contextvars
import functools
import hmac
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from websockets.exceptions import ConnectionClosed

from live.access.auth import Grant, TokenRefused, verify_token
from live.protocol.closes import CLOSE_NORMAL, CLOSE_POLICY
from live.doors.base import FrontDoor
from live.protocol import (
    ErrorEvent,
    ProtocolError,
    ResumptionPoint,
    ServerEvent,
    SessionClose,
    SessionReattached,
    SessionResume,
    SessionStart,
    is_image_message,
)
from live.server.queues import BYTES_PER_SECOND_OUT
from live.access.reattach import ReplayBuffer, new_resume_token, token_digest, with_seq

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from live.agent import Agent
    from live.engine.heard import HeardTracker
    from live.fleet.member import TokenUses
    from live.net.websocket import WebSocket
    from live.observe.record import SessionRecord
    from live.observe.watch import SessionObserver
    from live.server.config import ServerConfig
    from live.server.queues import ClientOutbox

__all__ = ["AFTER_GOODBYE_GRACE", "AttachmentHost", "ClientAttachment", "peer_address", "principal_of"]

# How long a session waits for a client that closed its socket normally but
# may come back (a Live API app resuming after a goAway does so at once).
AFTER_GOODBYE_GRACE = 10.0

log = logging.getLogger("live.server")


class AttachmentHost(Protocol):
    """What a session's client attachment needs of its session."""

    id: str
    agent: Agent
    config: ServerConfig
    clock: Callable[[], float]
    tg: TaskGroup
    obs: SessionObserver
    record: SessionRecord | None
    outbox: ClientOutbox
    frame_limit: int
    heard: HeardTracker
    end_reason: str | None
    spent_tokens: TokenUses

    @property
    def server_stopping(self) -> bool: ...

    def peer_of(self, ws: Any) -> str: ...

    def finish(self, reason: str, close_code: int = ..., error: ErrorEvent | None = None) -> None: ...

    def leave_parked(self, reason: str) -> None: ...

    def frame_too_large(self, size: int) -> None: ...

    def image_too_large(self, message_size: int) -> ErrorEvent: ...

    def internal_error(self) -> None: ...

    def event(self, event: ServerEvent) -> None: ...

    def client_audio(self, frame: bytes, *, behind: bool) -> None: ...

    async def client_frame(self, frame: str | bytes, *, behind: bool, inputs: list | None = None) -> None: ...

    def read_frame(self, frame: str | bytes) -> list | None: ...

    def take_now(self, inputs: list, *, behind: bool = False) -> bool: ...


class ClientAttachment:
    """The socket a session's client is on (None while it is away), and its pumps."""

    def __init__(self, runner: AttachmentHost, ws: WebSocket, door: FrontDoor) -> None:
        self._runner = runner
        self.ws: WebSocket | None = ws
        self.door = door
        self.peer = runner.peer_of(ws)
        self.grant: Grant | None = None
        # Who the session belongs to: None when it was not opened with a signed
        # token; else its subject ("" for none). A resume must be for the same.
        self.principal: str | None = None
        config = runner.config
        reattach = door.capabilities.reattach and config.reattach_grace > 0
        self.replay = ReplayBuffer(
            max_audio_bytes=int(config.reattach_audio_seconds * BYTES_PER_SECOND_OUT) if reattach else 0,
            max_events=config.reattach_events if reattach else 0,
        )
        self.resume_digest: str | None = None
        # A client told as the session goes whether it could resume now (a Live
        # API app's sessionResumptionUpdate): the token it would resume with,
        # and what it was told last.
        self.tells_resumption = False
        self._resume_token: str | None = None
        self._told_resumable: bool | None = None
        # Where the stream was when the socket was lost: a client whose frames
        # are not numbered gets what came after it when it comes back.
        self.seq_at_loss: int | None = None
        # Taken once per frame to the client and almost never contended: no
        # extra trip through the event loop when it is free.
        self.send_lock = anyio.Lock(fast_acquire=True)
        self._socket_done = anyio.Event()  # the current socket was let go (or the session ended)
        self._away: anyio.CancelScope | None = None
        self.reattaches = 0
        # Frames read in the session, counted per frame; the idle watch and the
        # metrics take them from here (a clock read per frame would cost more).
        self.frames_read = 0
        self._frames_watched = 0
        self._read: list | None = None  # a frame's inputs read in the socket's callback, for the reader
        self.last_client_frame = runner.clock()

    # ------------------------------------------------------------------ sending

    async def send_now(self, event: ServerEvent) -> None:
        """Send outside the stream (before the pumps run, or after they stopped)."""
        self._runner.obs.event(event)
        await self.send_frames(self.door.event(event))

    async def send_frames(self, frames: str | bytes | tuple[str | bytes, ...] | None) -> None:
        """A door's frame (or frames, or none), outside the stream."""
        runner = self._runner
        ws = self.ws
        if ws is None or frames is None:
            return
        for frame in frames if isinstance(frames, tuple) else (frames,):
            try:
                await ws.send(frame)
            except ConnectionClosed:
                return
            runner.obs.frame_out(frame, runner.clock())
            if runner.record is not None:
                runner.record.server_frame(frame)

    def keep_for_reattach(self) -> None:
        """The client may come back (its door said so once its opening was
        read): keep the stream for a replay, as for a door that always may, and
        tell it as the session goes whether it could resume now."""
        self.tells_resumption = True
        config = self._runner.config
        self.replay.max_audio_bytes = int(config.reattach_audio_seconds * BYTES_PER_SECOND_OUT)
        self.replay.max_events = config.reattach_events

    async def write_client(self) -> None:
        """The session's stream to the client, numbered and kept for a replay.

        Without a socket (the client is away) frames are only kept. Reply audio
        leaves the stream as PCM; a door that does not take it as is writes it
        in its own frames here, after the pacing.
        """
        runner = self._runner
        outbox = runner.outbox
        replay = self.replay
        sent = runner.obs.frame_out
        clock = runner.clock
        heard = runner.heard
        lock = self.send_lock
        door = self.door
        numbered = door.capabilities.reattach
        raw_audio = door.capabilities.raw_audio
        while True:
            frame = await outbox.get()
            if type(frame) is str:
                if numbered:
                    frame = with_seq(frame, replay.last_seq + 1)
            elif type(frame) is not bytes:  # an event the door writes in step with the audio before it
                await self.send_in_step(frame)
                continue
            elif not raw_audio:
                await self._write_audio(frame)
                continue
            seq = replay.add(frame)
            async with lock:
                ws = self.ws
                if ws is None:
                    continue
                try:
                    await ws.send(frame)
                except ConnectionClosed:
                    self.socket_lost(ws, unsent=seq)
                    continue
            sent(frame, clock())
            if type(frame) is bytes:
                heard.audio_sent(len(frame))
            if runner.record is not None:
                runner.record.server_frame(frame)

    async def send_in_step(self, event: Any) -> None:
        """An event of the door's `in_step_events`, written now that its turn came."""
        async with self.send_lock:
            await self.send_frames(self.door.event(event))

    async def _write_audio(self, pcm: bytes) -> None:
        """Reply audio in the door's own frames (a door without `raw_audio`)."""
        runner = self._runner
        async with self.send_lock:
            ws = self.ws
            if ws is None:
                return
            try:
                for frame in self.door.audio(pcm):
                    await ws.send(frame)
                    runner.obs.frame_out(frame, runner.clock())
            except ConnectionClosed:
                self.socket_lost(ws)
                return
        runner.heard.audio_sent(len(pcm))
        if runner.record is not None:
            runner.record.server_frame(pcm)

    # ------------------------------------------------------------------ the opening

    async def await_opening(self) -> SessionStart | SessionResume | None:
        """Read frames until the door's opening (a start or a resume); answer
        everything else, and check the start's credential."""
        runner = self._runner
        config = runner.config
        ws = self.ws
        assert ws is not None
        with anyio.move_on_after(config.start_timeout):
            while True:
                try:
                    frame = await ws.recv()
                except ConnectionClosed:
                    runner.finish("client disconnected before session.start")
                    return None
                self.last_client_frame = runner.clock()
                runner.obs.frames_in(1)
                if len(frame) > runner.frame_limit:
                    runner.frame_too_large(len(frame))
                    return None
                try:
                    opening = self.door.opening(frame)
                except ProtocolError as exc:
                    if exc.fatal:
                        # A stranger learns that it is not let in, and nothing
                        # of what the server would refuse a client it lets in.
                        refusal = await self.authorize(self.door.credential(), spend=False)
                        if refusal is not None:
                            exc = ProtocolError("unauthorized", refusal, fatal=True)
                        log.warning("session %s refused from %s: %s%s", runner.id, self.peer, exc.code, _hint(exc))
                        runner.finish(exc.message, CLOSE_POLICY, ErrorEvent(exc.code, exc.message, True))
                        return None
                    await self.send_now(ErrorEvent(exc.code, exc.message))
                    continue
                except (ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
                    # A frame of a shape the door did not foresee: bad input, as in a session.
                    log.info("session %s: an opening the %s door could not read (%s)", runner.id, self.door.name, type(exc).__name__)
                    await self.send_now(ErrorEvent("invalid_frame", "a frame this session could not read was dropped"))
                    continue
                if opening is None:
                    continue
                if isinstance(opening, ErrorEvent):
                    await self.send_now(opening)
                    continue
                if isinstance(opening, SessionClose):
                    runner.finish("client closed the session")
                    return None
                if isinstance(opening, SessionResume):
                    return opening
                refusal = await self.authorize(opening.token, spend=True)
                if refusal is None and self.door.checks_own_credentials:
                    refusal = await self.door.redeem()
                if refusal is not None:
                    log.warning("session %s refused from %s: unauthorized: %s", runner.id, self.peer, refusal)
                    runner.finish(refusal, CLOSE_POLICY, ErrorEvent("unauthorized", refusal, True))
                    return None
                grant = self.grant
                try:
                    opening = self.door.admitted(opening, grant)
                except ProtocolError as exc:
                    log.warning("session %s refused from %s: %s%s", runner.id, self.peer, exc.code, _hint(exc))
                    runner.finish(exc.message, CLOSE_POLICY, ErrorEvent(exc.code, exc.message, True))
                    return None
                if grant is not None:
                    log.info(
                        "session %s token accepted from %s subject=%s agent=%s max_duration=%s token_id=%s",
                        runner.id, self.peer, grant.subject, grant.agent, grant.max_duration, grant.token_id,
                    )
                return opening
        if runner.end_reason is None:
            text = f"no session.start within {config.start_timeout:g} s"
            log.warning("session %s closed from %s: %s", runner.id, self.peer, text)
            runner.finish(text, CLOSE_POLICY, ErrorEvent("idle_timeout", text, True))
        return None

    async def authorize(self, token: str | None, *, spend: bool) -> str | None:
        """None if the opening may go on (the token's grant kept); otherwise why not.

        `spend`: the token is to open a session (`session.start`): it must have
        a use left, spent once the session opens (`spend_token`); a resume
        (`spend=False`) shows a valid token for the session's subject, which
        may be the one that opened it. Never says or logs the token itself.
        """
        runner = self._runner
        config = runner.config
        if self.door.checks_own_credentials:
            return self.door.authorize(token)
        opening = "session.start" if spend else "session.resume"
        if config.token is None and config.token_secret is None:
            return None
        if token is None and self.ws is not None:
            token = bearer_token(self.ws)
        if not token:
            return (
                f"{opening} needs a token (its 'token' field, or Authorization: Bearer "
                "on the handshake)"
            )
        try:
            token.encode()
        except UnicodeEncodeError:
            return "the token is not valid text"
        if config.token is not None and hmac.compare_digest(token.encode(), config.token.encode()):
            return None
        if config.token_secret is None:
            return f"{opening} needs the server's token (this one is wrong)"
        try:
            grant = verify_token(
                token,
                config.token_secret,
                agent=runner.agent.name,
                issuer=config.token_issuer,
                max_lifetime=config.max_token_lifetime,
                resuming=not spend,
            )
        except TokenRefused as exc:
            return str(exc)
        if spend and await runner.spent_tokens.exhausted(grant):
            return _already_used(grant)
        self.grant = grant
        self.principal = principal_of(grant)
        return None

    async def spend_token(self) -> str | None:
        """The session opens: count it against its token's uses (a refused
        opening spends none). None if the token had a use left; else why not
        (another opening with the same token got there first, here or on
        another server of the fleet)."""
        grant = self.grant
        if grant is None or await self._runner.spent_tokens.spend(grant):
            return None
        return _already_used(grant)

    def new_resume_token(self) -> str:
        """A new resume token for this session; the one before it stops working now."""
        token = new_resume_token()
        self.resume_digest = token_digest(token)
        self._resume_token = token
        self._told_resumable = True  # it goes to the client with the session's start
        return token

    def resumption_point(self, idle: bool) -> None:
        """Whether the session could be resumed now changed (`idle`: nothing is
        generated and no call is unanswered): tell a client that is told as
        the session goes (the Live API's sessionResumptionUpdate), with the
        token it would resume with when it could."""
        if idle is self._told_resumable or self._resume_token is None:
            return
        self._told_resumable = idle
        self._runner.event(ResumptionPoint(self._resume_token if idle else None))

    # ------------------------------------------------------------------ reading

    async def read_client(self, ws: WebSocket) -> None:
        """Everything the client sends, in order.

        While this task waits for the next frame, an audio frame is taken by
        the socket's callback itself (`_take_audio`, where the socket offers
        `take_binary` and the door takes audio as is): the same steps, without
        waking this task.
        """
        runner = self._runner
        max_frame = runner.frame_limit
        said_goodbye = False
        waiting = _frames_waiting(ws)
        raw_audio = self.door.capabilities.raw_audio
        client_audio = runner.client_audio
        # The socket's callback runs outside any task: it runs the lane in a copy
        # of this task's context, so what it logs names the session.
        lane = (
            functools.partial(contextvars.copy_context().run, self._take_audio)
            if raw_audio and hasattr(ws, "take_binary")
            else None
        )
        if lane is not None:
            ws.take_binary = lane
        # A door that reads text frames (a carrier's JSON media) has them read in
        # the callback too: a frame of audio alone goes on from there; one with
        # more is handed to this task, read already (`_read`).
        text_lane = (
            functools.partial(contextvars.copy_context().run, self._take_text)
            if not raw_audio and hasattr(ws, "take_text")
            else None
        )
        if text_lane is not None:
            ws.take_text = text_lane
        try:
            while True:
                frame = await ws.recv()
                read, self._read = self._read, None
                if read is not None:  # read in the callback: counted there
                    await runner.client_frame(frame, behind=False, inputs=read)
                    continue
                self.frames_read += 1
                if len(frame) > max_frame:
                    if isinstance(frame, str) and is_image_message(frame):
                        # An image too large is a dropped frame, not a broken client.
                        runner.event(runner.image_too_large(len(frame)))
                        continue
                    runner.frame_too_large(len(frame))
                    return
                if raw_audio and type(frame) is bytes:
                    client_audio(frame, behind=waiting() > 0)
                else:
                    await runner.client_frame(frame, behind=waiting() > 0)
        except ConnectionClosed as closed:
            said_goodbye = _closed_normally(closed)
            if runner.end_reason is None and self.ws is ws and said_goodbye and not self.door.may_return_after_close():
                # The client said goodbye (1000): nothing to come back to. Its slot
                # and model connection are freed now, not after the reattach grace.
                runner.finish("client closed the connection")
                return
        finally:
            if lane is not None and ws.take_binary is lane:
                ws.take_binary = None
            if text_lane is not None and ws.take_text is text_lane:
                ws.take_text = None
        if runner.end_reason is None:
            self.socket_lost(ws, said_goodbye=said_goodbye)

    def _take_audio(self, frame: bytes) -> bool:
        """A binary frame from the socket's callback while the reader waits (so
        nothing the client sent earlier is still in hand); False leaves it to the reader.

        It runs in picows' callback: a failure here must end the session as the
        reader's would, not escape into the socket (which would close with 1011).
        """
        runner = self._runner
        if len(frame) > runner.frame_limit or runner.end_reason is not None:
            return False
        self.frames_read += 1
        try:
            runner.client_audio(frame, behind=False)
        except Exception:
            log.exception("session %s failed", runner.id)
            runner.internal_error()
        return True

    def _take_text(self, frame: str) -> bool:
        """A text frame from the socket's callback while the reader waits: read by
        the door here; done here when it is audio alone, else left to the reader
        (False) with what was read (`_read`), so it is read once."""
        runner = self._runner
        if len(frame) > runner.config.max_frame_bytes or runner.end_reason is not None:
            return False
        self.frames_read += 1
        try:
            inputs = runner.read_frame(frame)
            if inputs is None or runner.take_now(inputs):
                return True
        except Exception:
            log.exception("session %s failed", runner.id)
            runner.internal_error()
            return True
        self._read = inputs
        return False

    def frames_seen(self) -> None:
        """The frames read since the last look count, and the client was there then."""
        read = self.frames_read
        if read != self._frames_watched:
            runner = self._runner
            runner.obs.frames_in(read - self._frames_watched)
            self._frames_watched = read
            self.last_client_frame = runner.clock()

    # ------------------------------------------------------------------ away and back

    def socket_lost(self, ws: WebSocket, *, unsent: int | None = None, said_goodbye: bool = False) -> None:
        """The client's socket closed without `session.close`.

        With reattach on, the session goes on without a socket (its model
        connection open, its stream kept) for `reattach_grace` seconds;
        otherwise, or when the server is stopping, it ends. `unsent`: the
        number of the frame that could not be sent (the stream a client comes
        back to starts there). `said_goodbye`: the client closed normally, and
        may still come back (its door says so), but soon if at all: it is
        waited for `AFTER_GOODBYE_GRACE` seconds at most.
        """
        runner = self._runner
        if self.ws is not ws or runner.end_reason is not None:
            return  # an older socket, or the session is ending anyway
        grace = runner.config.reattach_grace
        if said_goodbye:
            grace = min(grace, AFTER_GOODBYE_GRACE)
        if runner.server_stopping or self.resume_digest is None:
            runner.finish("client disconnected")
            return
        if grace <= 0:
            runner.leave_parked("client disconnected")
            return
        self.ws = None
        self.seq_at_loss = self.replay.last_seq if unsent is None else unsent - 1
        self._socket_done.set()
        log.info("session %s lost its client; waiting %g s for it to come back", runner.id, grace)
        self._away = anyio.CancelScope()
        runner.tg.start_soon(self._await_return, self._away, grace)

    async def _await_return(self, scope: anyio.CancelScope, grace: float) -> None:
        with scope:
            await anyio.sleep(grace)
            self._runner.leave_parked(f"the client did not come back within {grace:g} s")

    async def attach(self, ws: WebSocket, last_seq: int, resume_token: str | None = None) -> None:
        """A new socket takes the session over: the frames it missed, then the
        live stream, and `resume_token` for the next time. A socket still
        attached (its drop not yet noticed) is let go."""
        runner = self._runner
        async with self.send_lock:
            old = self.ws
            if self._away is not None:
                self._away.cancel()
                self._away = None
            if not self.door.capabilities.reattach:  # unnumbered: what came after the loss
                last_seq = self.seq_at_loss if self.ws is None and self.seq_at_loss is not None else self.replay.last_seq
            frames, missed = self.replay.after(last_seq)
            self.ws = ws
            self._socket_done.set()
            self._socket_done = anyio.Event()
            self.last_client_frame = runner.clock()
            self.reattaches += 1
            said = self.door.event(SessionReattached(runner.id, len(frames), missed, resume_token))
            try:
                for frame in said if isinstance(said, tuple) else (said,) if said is not None else ():
                    await ws.send(frame)
                for frame in frames:
                    await ws.send(frame)
            except ConnectionClosed:
                pass
        if old is not None:
            runner.tg.start_soon(old.close, CLOSE_NORMAL, "replaced by a newer connection")
        log.info(
            "session %s reattached from %s: %d frame(s) replayed, %d missed",
            runner.id, runner.peer_of(ws), len(frames), missed,
        )
        runner.tg.start_soon(self.read_client, ws)

    async def serve_socket(self, ws: WebSocket) -> None:
        """Wait while `ws` is this session's socket (its handler must stay alive)."""
        runner = self._runner
        while self.ws is ws and runner.end_reason is None:
            await self._socket_done.wait()

    def let_go(self) -> None:
        """The session ended: a handler waiting in `serve_socket` returns."""
        self._socket_done.set()


def _hint(exc: ProtocolError) -> str:
    """What the operator could change about a refusal, for the log line."""
    return f" ({exc.hint})" if exc.hint else ""


def _frames_waiting(ws: WebSocket) -> Callable[[], int]:
    """How many frames were read from the client's socket and not yet taken, as
    a function; always 0 where the socket does not say (e.g. a test's fake)."""
    return getattr(ws, "frames_waiting", None) or (lambda: 0)


def _closed_normally(closed: ConnectionClosed) -> bool:
    """The peer closed with 1000 (normal closure): it is done, not cut off."""
    received = closed.rcvd
    return received is not None and received.code == CLOSE_NORMAL


def _already_used(grant: Grant) -> str:
    if grant.uses == 1:
        return "the token was already used to open a session (a token opens one: mint one per visit)"
    return f"the token was already used to open the {grant.uses} sessions it may open"


def principal_of(grant: Grant) -> str:
    """Whom a session opened with `grant` belongs to: its subject; for a token
    with no subject that names its sessions' end (a Live API ephemeral token,
    which the app comes back with), that token alone."""
    if grant.subject is not None:
        return grant.subject
    if grant.ends_at is not None and grant.token_id:
        return f"token:{grant.token_id}"
    return ""


def peer_address(connection: WebSocket) -> str:
    """The client's address as the socket knows it ("?" when it does not)."""
    try:
        address = connection.remote_address
    except Exception:
        return "?"
    return str(address[0]) if address else "?"


def bearer_token(ws: WebSocket) -> str | None:
    """The token of the handshake's `Authorization: Bearer` header (non-browser clients)."""
    request = ws.request
    if request is None:
        return None
    values = request.headers.get_all("Authorization")
    if len(values) != 1:
        return None
    scheme, _, token = values[0].strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
