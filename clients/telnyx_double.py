"""A Telnyx double: calls the server as Telnyx Call Control does, from Telnyx's public documentation.

An incoming call is a signed webhook (`call.initiated`, JSON; Ed25519 over
`"{telnyx-timestamp}|{body}"` with the account's key); the application
answers through the REST API (`POST /v2/calls/{call_control_id}/actions/answer`
with `stream_url`, `client_state`, bidirectional `rtp` mode), which this
double serves on a port of its own and checks for the API key. Then the
double opens the stream and speaks Telnyx's media streaming messages
(`connected`, `start` with `media_format` and the answer's `client_state`,
`media` with `chunk` numbers, `dtmf`, `stop`; snake_case, `stream_id`), and
plays what comes back as `TwilioCall` does (marks echoed when played, `clear`).
`hangup` and `transfer` actions end the call's stream.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import h11
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from websockets.asyncio.client import connect as ws_connect

from clients.phone_double import CallRefused, TwilioCall, http_post_raw, on_the_line

__all__ = ["TelnyxCall", "TelnyxDouble"]


class TelnyxCall(TwilioCall):
    """One Telnyx call on its stream (the caller's side, as `TwilioCall`)."""

    STREAM_FIELD = "stream_id"
    SEQUENCE_FIELD = "sequence_number"

    def _addressed(self, message: dict) -> bool:
        # What the application sends Telnyx needs no stream id; if one is given it must be this one.
        return message.get("stream_id", self.stream_sid) == self.stream_sid

    async def hang_up(self) -> None:
        with contextlib.suppress(Exception):
            await self._send({"event": "stop", "stop": {"user_id": "u", "call_control_id": self.call_sid}})


class TelnyxDouble:
    """Telnyx's side of calls to one account: its signing key, its API key, its REST API."""

    def __init__(self, api_key: str | None = None) -> None:
        self._signing_key = Ed25519PrivateKey.generate()
        self.public_key = base64.b64encode(self._signing_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
        self.api_key = api_key or "KEY" + secrets.token_hex(16)
        self.actions: list[tuple[str, str, dict]] = []  # (call_control_id, action, body) as the API got them
        self.calls: dict[str, TelnyxCall] = {}
        self._answers: dict[str, anyio.Event] = {}
        self._answered: dict[str, dict] = {}
        self.api_port: int | None = None

    @property
    def api_base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}/v2"

    def sign(self, body: bytes, timestamp: int | None = None) -> dict[str, str]:
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        signature = self._signing_key.sign(stamp.encode() + b"|" + body)
        return {"telnyx-signature-ed25519": base64.b64encode(signature).decode(), "telnyx-timestamp": stamp}

    # ------------------------------------------------------------------ the REST API

    async def serve_api(self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.api_port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        task_status.started(self.api_port)
        async with listener:
            await listener.serve(self._api_connection)

    async def _api_connection(self, stream: anyio.abc.ByteStream) -> None:
        conn = h11.Connection(h11.SERVER)
        request, body = None, bytearray()
        async with stream:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive())
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    break
            status, answer = await self._api(request, bytes(body))
            data = json.dumps(answer).encode()
            await stream.send(conn.send(h11.Response(status_code=status, headers=[
                ("Content-Type", "application/json"), ("Content-Length", str(len(data))), ("Connection", "close")]))
                + conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))

    async def _api(self, request: h11.Request, body: bytes) -> tuple[int, dict]:
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        if headers.get("authorization") != f"Bearer {self.api_key}":
            return 401, {"errors": [{"code": "10009", "title": "Authentication failed"}]}
        parts = request.target.decode().split("/")  # /v2/calls/{id}/actions/{action}
        if request.method != b"POST" or len(parts) != 6 or parts[1:3] != ["v2", "calls"] or parts[4] != "actions":
            return 404, {"errors": [{"code": "10005", "title": "Resource not found"}]}
        call_id, action = parts[3], parts[5]
        params = json.loads(body or b"{}")
        self.actions.append((call_id, action, params))
        if action == "answer":
            self._answered[call_id] = params
            if call_id in self._answers:
                self._answers[call_id].set()
        elif action in ("hangup", "transfer") and call_id in self.calls:
            call = self.calls[call_id]
            call.new_twiml = f"{action} {params.get('to', '')}".strip()
            await call.hang_up()
            with contextlib.suppress(Exception):
                await call.ws.close()
        return 200, {"data": {"result": "ok"}}

    # ------------------------------------------------------------------ calls

    async def ring(self, webhook_url: str, *, call_id: str | None = None, forged: bool = False) -> tuple[int, str, str]:
        """POST `call.initiated` for an incoming call; (status, body, call_control_id)."""
        call_id = call_id or "v3:" + secrets.token_urlsafe(30)
        body = json.dumps({"data": {
            "event_type": "call.initiated", "id": str(uuid.uuid4()), "occurred_at": "2026-12-02T10:00:00Z",
            "record_type": "event",
            "payload": {"call_control_id": call_id, "call_leg_id": str(uuid.uuid4()), "call_session_id": str(uuid.uuid4()),
                        "connection_id": "1234567890", "direction": "incoming", "from": "+15550100001",
                        "to": "+15550100002", "state": "parked"},
        }, "meta": {"attempt": 1, "delivered_to": webhook_url}}).encode()
        headers = self.sign(body)
        if forged:
            headers = TelnyxDouble().sign(body)
        status, answer = await http_post_raw(webhook_url, body, {"Content-Type": "application/json", **headers})
        return status, answer.decode("utf-8", "replace"), call_id

    @contextlib.asynccontextmanager
    async def call(self, webhook_url: str, *, encoding: str = "PCMU", stream_url: str | None = None) -> AsyncIterator[TelnyxCall]:
        """An incoming call the server answers with a stream; the stream open until hang-up."""
        call_id = "v3:" + secrets.token_urlsafe(30)
        answered = self._answers[call_id] = anyio.Event()
        status, body, _ = await self.ring(webhook_url, call_id=call_id)
        if status != 200:
            raise CallRefused(status, body)
        with anyio.fail_after(5):
            await answered.wait()
        params = self._answered[call_id]
        stream_id = str(uuid.uuid4())
        async with ws_connect(stream_url or params["stream_url"], compression=None, max_size=1 << 20) as ws:
            await ws.send(json.dumps({"event": "connected", "version": "1.0.0"}))
            await ws.send(json.dumps({"event": "start", "sequence_number": "1", "stream_id": stream_id, "start": {
                "user_id": str(uuid.uuid4()), "call_control_id": call_id, "client_state": params.get("client_state"),
                "media_format": {"encoding": encoding, "sample_rate": 8000, "channels": 1}}}))
            call = TelnyxCall(ws, stream_id, call_id, time.monotonic())
            async with on_the_line(call, self.calls, call_id):
                yield call
