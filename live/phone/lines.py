"""Phone lines on a server: the media doors and the webhooks for the carriers it answers.

What `live serve --twilio` / `--telnyx` mount: a door per carrier's media
path (a factory the server calls per socket), its webhooks (served by
`live.net.http_post.PostListener`, or on the WebSocket port itself), and the
task that runs the carriers' REST commands a webhook decided on (`run`:
Telnyx wants its webhook answered at once, the command after). One
`CallTokens` signs every call's token, whichever carrier brought the call.

Whether a call is taken is the server's to say (`refusal`: full, draining);
when it is not, each carrier's webhook answers as `busy` says, so the caller
hears a sentence, a busy tone or the carrier's fallback, never a dead line.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import quote, urlsplit

import anyio
import anyio.abc

from live.agent import KeyEntry
from live.doors.base import FrontDoor
from live.phone.calls import CallTokens
from live.phone.carrier import CallLine, codec_named
from live.phone.control import CallControl
from live.phone.webhooks import Handler, TwilioSignatures, TwilioVoiceWebhook, stream_url_for

__all__ = [
    "COMMAND_QUEUE",
    "PhoneLines",
    "TELNYX_CALL_PATH",
    "TELNYX_MEDIA_PATH",
    "TWILIO_MEDIA_PATH",
    "TWILIO_STATUS_PATH",
    "TWILIO_VOICE_PATH",
]

log = logging.getLogger("live.phone")

TWILIO_VOICE_PATH = "/twilio/voice"
TWILIO_STATUS_PATH = "/twilio/status"
TWILIO_MEDIA_PATH = "/twilio/media"
TELNYX_CALL_PATH = "/telnyx/call"
TELNYX_MEDIA_PATH = "/telnyx/media"
# Carrier commands waiting for the task that runs them; one more and the
# webhook answers 503 (the carrier delivers it again, or to its failover URL).
COMMAND_QUEUE = 256
# Carrier commands in flight at once.
COMMANDS_AT_ONCE = 16
# What a call's progress is counted as (Twilio's call statuses; Telnyx's call events).
TWILIO_STATUSES = frozenset({"queued", "initiated", "ringing", "in-progress", "completed", "busy", "failed",
                             "no-answer", "canceled"})
TELNYX_EVENTS = frozenset({"call.initiated", "call.answered", "call.hangup", "streaming.started", "streaming.stopped",
                           "streaming.failed", "call.machine.detection.ended", "call.machine.greeting.ended",
                           "call.machine.premium.detection.ended", "call.machine.premium.greeting.ended",
                           "call.speak.ended"})


@dataclasses.dataclass
class PhoneLines:
    """The doors (WebSocket path -> door factory) and webhooks (path -> handler) of a server's phone lines."""

    tokens: CallTokens = dataclasses.field(default_factory=CallTokens)
    doors: dict[str, Callable[..., FrontDoor]] = dataclasses.field(default_factory=dict)
    webhooks: dict[str, Handler] = dataclasses.field(default_factory=dict)
    public_hosts: set[str] = dataclasses.field(default_factory=set)  # names the carriers reach us by
    twilio_webhook: TwilioVoiceWebhook | None = None
    telnyx_webhook: object | None = None
    # What the agent's keys, transfers and the operator's choices are, for every call.
    on_key_press: Callable[[str, str], object] | None = None
    key_entry: KeyEntry = dataclasses.field(default_factory=KeyEntry)
    destinations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    busy: str = "say"

    def __post_init__(self) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[tuple[str, Callable[[], Awaitable[None]]]](
            COMMAND_QUEUE
        )
        self._refusal: Callable[[], str | None] = lambda: None
        self.commands_run = 0
        self.commands_failed = 0

    @classmethod
    def twilio(
        cls,
        auth_token: str,
        public_url: str,
        *,
        agent: str | None = None,
        token_secret: str | None = None,
        stream_url: str | None = None,
        on_dtmf: Callable[[str, str], object] | None = None,
        control: CallControl | None = None,
        key_entry: KeyEntry | None = None,
    ) -> PhoneLines:
        lines = cls(tokens=CallTokens(token_secret, agent=agent), on_key_press=on_dtmf)
        if key_entry is not None:
            lines.key_entry = key_entry
        return lines.add_twilio(auth_token, public_url, stream_url=stream_url, control=control)

    # ------------------------------------------------------------------ whether calls are taken

    def refuse_when(self, refusal: Callable[[], str | None]) -> None:
        """`refusal()`: None while the server takes calls, else why not (full, draining)."""
        self._refusal = refusal
        for webhook in (self.twilio_webhook, self.telnyx_webhook):
            if webhook is not None:
                webhook.refusal = refusal

    def count_with(self, metrics: object) -> None:
        """Count the webhooks' answers and the calls' progress in `metrics`
        (`live.observe.metrics.Metrics`), by carrier: closed sets of labels."""
        answers = metrics.phone_webhooks
        statuses = metrics.phone_call_status
        if self.twilio_webhook is not None:
            self.twilio_webhook.counted = lambda answer: answers.labels("twilio", answer).inc()
            self.twilio_webhook.count_status = lambda status: statuses.labels(
                "twilio", status if status in TWILIO_STATUSES else "other").inc()
        if self.telnyx_webhook is not None:
            self.telnyx_webhook.counted = lambda answer: answers.labels("telnyx", answer).inc()
            self.telnyx_webhook.count_status = lambda status: statuses.labels(
                "telnyx", status if status in TELNYX_EVENTS else "other").inc()

    # ------------------------------------------------------------------ carriers

    def _line(self, control: CallControl | None, **extra) -> CallLine:
        return CallLine(self.tokens, control=control, on_key_press=self.on_key_press, key_entry=self.key_entry,
                        destinations=dict(self.destinations), **extra)

    def add_twilio(
        self, auth_token: str, public_url: str, *, stream_url: str | None = None,
        on_dtmf: Callable[[str, str], object] | None = None, control: CallControl | None = None,
        shared_key: str | None = None,
    ) -> PhoneLines:
        from live.phone.twilio import TwilioDoor, handshake_check

        if on_dtmf is not None:
            self.on_key_press = on_dtmf
        signatures = TwilioSignatures(auth_token, shared_key)
        webhook = TwilioVoiceWebhook(signatures, public_url, self.tokens, media_path=TWILIO_MEDIA_PATH,
                                     stream_url=stream_url)
        webhook.refusal = self._refusal
        webhook.busy = self.busy
        self.twilio_webhook = webhook
        if control is not None and hasattr(control, "transfer"):
            # A transfer that does not connect comes back to this webhook, and to the agent.
            control.transfer_action = lambda call, name: f"{webhook.public_url}{TWILIO_VOICE_PATH}?transfer={quote(name)}"
        line = self._line(control, handshake=handshake_check(signatures, lambda: webhook.stream_url))
        self.doors[TWILIO_MEDIA_PATH] = functools.partial(TwilioDoor, line=line)
        self.webhooks[TWILIO_VOICE_PATH] = webhook.answer
        self.webhooks[TWILIO_STATUS_PATH] = webhook.status
        self._public(public_url, webhook.stream_url)
        return self

    def add_telnyx(
        self, public_key: str, api_key: str, public_url: str, *, stream_url: str | None = None,
        api_base_url: str = "https://api.telnyx.com/v2", on_dtmf: Callable[[str, str], object] | None = None,
        codec: str = "PCMU", connection_id: str | None = None,
    ) -> PhoneLines:
        from live.phone.telnyx import TelnyxCallControl, TelnyxCallWebhook, TelnyxDoor
        from live.phone.webhooks import check_stream_url

        if on_dtmf is not None:
            self.on_key_press = on_dtmf
        control = TelnyxCallControl(api_key, base_url=api_base_url, connection_id=connection_id)
        stream = check_stream_url(stream_url) if stream_url else stream_url_for(public_url, TELNYX_MEDIA_PATH)
        # What Telnyx plays of ours: L16 only at 16 kHz, the rate its guide gives.
        reply = codec_named(codec, 16_000 if codec == "L16" else 8_000)
        line = self._line(control, reply_codec=reply)
        webhook = TelnyxCallWebhook(public_key, control, stream, self.tokens, line=line, stream_codec=codec)
        webhook.refusal = self._refusal
        webhook.busy = self.busy
        webhook.commands = self.queue
        self.telnyx_webhook = webhook
        self.doors[TELNYX_MEDIA_PATH] = functools.partial(TelnyxDoor, line=line)
        self.webhooks[TELNYX_CALL_PATH] = webhook.answer
        self._public(public_url, stream)
        return self

    def _public(self, *urls: str) -> None:
        self.public_hosts.update(h for h in (urlsplit(url).hostname for url in urls) if h)

    def mounted_on(self, doors: Mapping[str, Callable[..., FrontDoor]]) -> dict[str, Callable[..., FrontDoor]]:
        """`doors` with the phone doors added."""
        return {**doors, **self.doors}

    # ------------------------------------------------------------------ carrier commands

    def queue(self, what: str, command: Callable[[], Awaitable[None]]) -> bool:
        """Queue a carrier command for `run`; False when the queue is full (the webhook answers 503)."""
        try:
            self._send.send_nowait((what, command))
        except anyio.WouldBlock:
            log.warning("carrier commands: %d waiting already; %s refused for now", COMMAND_QUEUE, what)
            return False
        return True

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the queued carrier commands until cancelled, `COMMANDS_AT_ONCE` at a time;
        every command is a task of this call's task group."""
        limiter = anyio.CapacityLimiter(COMMANDS_AT_ONCE)

        async def one(what: str, command: Callable[[], Awaitable[None]]) -> None:
            async with limiter:
                try:
                    await command()
                    self.commands_run += 1
                except Exception as exc:  # the carrier's refusal, the network: logged, the lines go on
                    self.commands_failed += 1
                    log.warning("carrier command %s failed: %s", what,
                                str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)

        async with anyio.create_task_group() as tg:
            task_status.started()
            async for what, command in self._receive:
                tg.start_soon(one, what, command)
