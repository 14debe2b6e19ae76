"""What a server allows and how it behaves at each limit: `ServerConfig`."""

from __future__ import annotations

import dataclasses

from live.protocol import image_bytes_fitting

__all__ = ["ServerConfig"]


# Frames a client's socket may buffer before it stops reading from it (its
# queue's high-water mark); each is at most twice `max_frame_bytes`.
WS_QUEUE_FRAMES = 2


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Limits and checks; every bound says what happens when it is reached.

    Each field is a `live serve` option of the same name (`max_sessions` is
    `--max-sessions`); docs/serving.md has them all with their defaults, and
    docs/access.md the Host, Origin, token and TLS ones.

    - `max_sessions`: sessions beyond it get a `capacity` error and close 1013.
    - `max_frame_bytes`: a larger client frame gets a `frame_too_large` error and
      closes the socket with 1009. With the socket's queue (`WS_QUEUE_FRAMES`
      frames of up to twice this) it sets what one socket can make the server
      hold; docs/serving.md ("Memory per socket") has the sum.
    - `idle_timeout`: a session whose client sends nothing for this long ends.
    - `allowed_hosts`: `Host` names answered besides the bind address (or, bound
      to loopback or a wildcard address, localhost, 127.0.0.1 and [::1]); any
      other Host gets 403 before anything else (DNS rebinding). A leading dot
      allows subdomains; `("*",)` allows any.
    - `allowed_origins`: browser Origins allowed besides pages on an allowed
      host; `("*",)` allows any.
    - `token`: a static shared token (for development); when set,
      `session.start` may carry it.
    - `token_secret`: when set, `session.start` and `session.resume` (or the
      handshake's `Authorization: Bearer`) must carry a JWT signed with it
      (`live.access.auth`); with `token` also set, either opens a session. A JWT opens
      one session (its `jti`), and a resume needs one for the session's subject.
    - `token_issuer`: when set, a JWT's `iss` must be this.
    - `max_token_lifetime`: a JWT valid for longer than this (seconds, from its
      `iat` or from now) is refused.
    - `start_timeout`: a socket that has not started a session this long after
      its handshake is closed (`idle_timeout`, close 1008).
    - `max_pending`: sockets waiting for `session.start` at once; one more gets
      `pending_limit` and close 1013.
    - `max_pending_per_ip`: of those, sockets from one client address (an IPv6
      client by its /64), so that one address cannot hold them all; one more
      gets `pending_limit` and close 1013.
    - `max_sessions_per_ip`: sockets (pending or in a session) per client
      address (an IPv6 client by its /64); one more gets `address_limit` and
      close 1013. A conversation counts once, whichever socket it is on.
    - `forwarded_allow_ips`: proxies (addresses, CIDRs, `*` for any) whose
      `X-Forwarded-For` names the client: the client's address is its rightmost
      hop that is not one of them. A socket that names no client is a client
      on the peer's own address, limited as any (`live.addresses`).
    - `audio_queue_frames`, `audio_queue_bytes`: client audio waiting for the
      model (two seconds of 20 ms frames, enough to cover a change of model
      connection; the bytes: two seconds at 48 kHz); beyond either the oldest is
      dropped and counted.
    - `control_queue_bytes`: typed turns and tool results waiting for the model;
      beyond it the server stops reading from the client until the model side
      catches up.
    - `max_image_bytes`: a larger image is dropped with an `image_too_large`
      error (the session goes on). None: as large as fits in `max_frame_bytes`
      as base64 in its JSON message (about 48 KB at the default 64 KiB); an
      image message over `max_frame_bytes` (up to the socket's cut-off at twice
      it) is refused the same way rather than closing the socket.
    - `max_image_rate`: image frames a second; more are dropped with an
      `image_rate_limited` error (at most one a second).
    - `audio_coalesce_frames`: when client frames wait for the model (it fell
      behind, or its connection is being replaced), up to this many go out as
      one chunk; with nothing waiting each frame goes out alone, at once.
    - `outbound_audio_seconds`: model audio waiting for the client; beyond it the
      server stops reading from the model until the client catches up.
    - `audio_lead`: how far ahead of real time audio is sent to the client
      (None: as fast as the socket takes it).
    - `stall_timeout`: a model that owes a reply (to a user turn or a tool
      result) for this long is reported and the session resumed elsewhere.
    - `handover_margin`: after a go-away, the session moves to a new connection
      at the first safe point, or this long before the deadline at the latest.
    - `reconnect_attempts`: failed resumptions in a row before the session ends;
      the count resets once a connection stayed up `stable_after` seconds.
    - `certfile`, `keyfile`: serve https:// and wss:// with this certificate
      chain and private key (PEM; the key may be in `certfile`).
    - `reattach_grace`: when a client's socket drops without `session.close`,
      the session (and its model connection) waits this long for the client to
      come back with `session.resume`; 0 ends it at once.
    - `drain_timeout`: with a shared store (`--redis`), how long a stopping
      server waits for each session to reach a safe point before it hands the
      session to the fleet anyway; without one, how long a Live API app's
      session, told with the service's goAway, may finish what is in flight
      before it ends.
    - `reattach_audio_seconds`, `reattach_events`: what a session keeps of its
      stream for a client that comes back (`live.access.reattach.ReplayBuffer`):
      beyond the first, the oldest reply audio is dropped; beyond the second,
      the oldest event. What a replay lacks is reported as `missed`.
    - `near_capacity`: the share of `max_sessions` from which `/healthz`
      answers 503 `near_capacity`, so a load balancer routes new sessions to
      another process before this one refuses them (the sessions here go on).
    - `reuse_port`: share the port with other server processes (SO_REUSEPORT,
      Linux): the kernel spreads new connections across them.
    - `metrics_port`: serve `/metrics` on this port (0: a free one) instead of
      the serving port, so it can stay private; on `metrics_host` (loopback by
      default), with the Host check of the serving port.
    - `metrics_allow_ips`: who may read `/metrics` (addresses, CIDRs, `*`),
      by the client's address (the socket's peer, or behind a trusted proxy
      the client it names); loopback always may.
    - `call_drain_timeout`: when the server stops, how long its phone calls
      may go on (new ones are refused) before the agent says goodbye on each;
      `goodbye_timeout`: how long that goodbye may take to be said and heard
      before the call is hung up anyway.
    - `sockets`: the WebSocket layer: `picows` (compiled framing), `websockets`,
      or `auto` (picows where it can be imported; `live.net.sockets`).
    """

    host: str = "127.0.0.1"
    port: int = 8765
    max_sessions: int = 100
    max_frame_bytes: int = 64 << 10
    idle_timeout: float = 300.0
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    token: str | None = None
    token_secret: str | None = None
    token_issuer: str | None = None
    max_token_lifetime: float = 3600.0
    start_timeout: float = 10.0
    max_pending: int = 32
    max_pending_per_ip: int = 8
    max_sessions_per_ip: int = 10
    forwarded_allow_ips: tuple[str, ...] = ("127.0.0.1", "::1")
    audio_queue_frames: int = 100
    audio_queue_bytes: int = 192_000
    control_queue_bytes: int = 128 << 10
    max_image_bytes: int | None = None
    max_image_rate: float = 2.0
    audio_coalesce_frames: int = 5
    outbound_audio_seconds: float = 10.0
    audio_lead: float | None = 0.5
    stall_timeout: float = 20.0
    handover_margin: float = 1.0
    reconnect_attempts: int = 5
    stable_after: float = 60.0
    shutdown_grace: float = 2.0
    reattach_grace: float = 30.0
    drain_timeout: float = 30.0
    reattach_audio_seconds: float = 5.0
    reattach_events: int = 512
    reuse_port: bool = False
    near_capacity: float = 0.9
    certfile: str | None = None
    keyfile: str | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_allow_ips: tuple[str, ...] = ()
    sockets: str = "auto"
    call_drain_timeout: float = 600.0
    goodbye_timeout: float = 20.0

    def __post_init__(self) -> None:
        if not 0 < self.near_capacity <= 1:  # also refuses NaN
            raise ValueError(f"near_capacity is a share of max_sessions, more than 0 and at most 1, not {self.near_capacity}")

    @property
    def scheme(self) -> str:
        return "https" if self.certfile else "http"

    @property
    def metrics_on_serving_port(self) -> bool:
        """`/metrics` is on the serving port unless a port of its own was given."""
        return self.metrics_port is None

    @property
    def image_limit(self) -> int:
        """The largest image accepted: `max_image_bytes`, or what fits in a frame."""
        return self.image_limit_within(self.max_frame_bytes)

    def image_limit_within(self, message_bytes: int) -> int:
        """The largest image accepted from a client whose messages may be this
        large (a door's own limit): `max_image_bytes`, or what fits in one."""
        fitting = image_bytes_fitting(message_bytes)
        return fitting if self.max_image_bytes is None else min(self.max_image_bytes, fitting)

