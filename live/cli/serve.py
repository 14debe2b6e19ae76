"""`live serve`: run the session server for a model or an agent.

Every configured name is resolved before the port opens, so a typo in a model
name, a missing API key or a broken agent module fails at start, not on the
first call.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import secrets
import signal
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio
import anyio.abc

from live.cli import capacity

from live.observe import logs
from live.access.addresses import address_key
from live.backends import BackendPool, PoolError
from live.agent import END_OF_TURN, TURN_MODES, Agent, agent_at
from live.access.auth import check_secret
from live.errors import AmbiguousModelError, LiveError, UnknownModelError
from live.extras import MissingExtra, require
from live.net.sockets import LAYERS
from live.fleet.member import Fleet
from live.net.loop import CHOICES as LOOPS, LoopUnavailable, backend_options
from live.protocol import image_bytes_fitting
from live.registry import LlmRegistry, default_registry
from live.access.addresses import AddressSet
from live.observe.record import Recorder
from live.observe.metrics import enable_multiprocess, multiprocess_enabled, remove_multiprocess_dir, worker_stopped
from live.doors.gemini_live import gemini_doors
from live.doors.gemini_tokens import AUTH_TOKENS_PATH
from live.doors.gemini_policy import GeminiPolicy, PolicyError
from live.net.http_post import Handler, PostListener
from live.server.port import DEFAULT_DOORS, LiveServer, ServerConfig, tls_context, tune_gc_for_serving
from live.fleet.store import FactsKey, StoreError, open_store

if TYPE_CHECKING:
    from live.phone.lines import PhoneLines

DEFAULT_MODEL = "local/echo"
DEFAULT_INSTRUCTION = "You are a friendly voice assistant. Keep your answers short and clear."


class UsageError(Exception):
    """A start-up problem the user can fix; printed as one line."""


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0 or value != value:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 1, not {text}")
    return value


def _positive(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _sessions(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return _positive(int)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"a positive number or auto, not {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="live serve",
        description=(
            "Serve live audio sessions: WebSocket /live, browser client /, health /healthz. "
            "With no --model and no --agent it runs the built-in local/echo model, which "
            "needs no API key. For Gemini: export GOOGLE_API_KEY and pass --model "
            "gemini-... or an --agent whose model is a Gemini model."
        ),
        epilog=(
            "Documentation (in docs/ of the checkout, or the site mkdocs builds from it): "
            "docs/quickstart.md (first steps), docs/serving.md (every option and its limit), "
            "docs/access.md (tokens, Host and Origin checks, TLS), docs/troubleshooting.md "
            "(no sound device, no key, port in use, ...)."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1; 0.0.0.0 for every interface, with --allow-host NAME for the name other machines use)")
    parser.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    who = parser.add_argument_group("what to serve")
    who.add_argument("--model", help=f"model name, e.g. gemini-2.5-flash-native-audio-preview-09-2025 or {DEFAULT_MODEL} (the default)")
    who.add_argument("--agent", metavar="MODULE:ATTR", help="an agent, e.g. samples.weather:agent (--model then overrides its model)")
    who.add_argument("--backends", metavar="FILE", help="a TOML file of where sessions may run, in order: AI Studio keys (named by environment variable), Vertex AI projects and regions, each with the models it serves there; a session moves down the list when its backend fails in a way resumption cannot fix (quota, a region down, a model not served there) (see docs/resilience.md; default: the agent's backends, else the one --model names)")
    turns = parser.add_argument_group("turn-taking (see docs/turn-taking.md)")
    turns.add_argument("--turn-taking", choices=TURN_MODES, help="who ends the user's turns when a session does not say: auto (the model's voice detection), manual (the client's activity signals), server (this server's voice detection; the 'turns' extra) (default: the agent's)")
    turns.add_argument("--end-of-turn", choices=END_OF_TURN, help="with --turn-taking server: silence (silence timing) or smart (Smart Turn listens to how the sentence ends at each pause; the 'smart-turn' extra) (default: the agent's)")
    turns.add_argument("--end-silence", type=_positive(float), metavar="SECONDS", help="with --turn-taking server: the silence that ends a user's turn (default: the agent's)")
    limits = parser.add_argument_group("limits and checks")
    limits.add_argument("--max-sessions", type=_sessions, default="auto", help="concurrent sessions in this process (default auto: what one process holds in real time on this machine's core, with headroom, from a timing of about 0.02 s at start; a few for local/voice, which recognises speech in the process; see docs/performance.md#capacity)")
    limits.add_argument("--near-capacity", type=_fraction, default=0.9, metavar="SHARE", help="share of --max-sessions from which /healthz answers 503 near_capacity, so a load balancer sends new sessions elsewhere (default 0.9; /livez stays 200)")
    limits.add_argument("--max-frame-bytes", type=_positive(int), default=64 << 10, help="largest client frame: a session.start with its history, a typed turn, a tool result, an audio frame (default 64 KiB)")
    limits.add_argument("--max-image-bytes", type=_positive(int), help="largest camera or screen image; larger ones are dropped with an image_too_large error (default: as large as fits in --max-frame-bytes as base64, about 48 KB at 64 KiB)")
    limits.add_argument("--max-image-rate", type=_positive(float), default=2.0, help="camera or screen images per second; more are dropped with an image_rate_limited error (default 2; the model samples about 1)")
    limits.add_argument("--idle-timeout", type=_positive(float), default=300.0, help="seconds without client input before a session ends (default 300)")
    limits.add_argument("--allow-host", action="append", default=[], metavar="NAME", help="a Host name the server answers to besides its bind address (bound to loopback or 0.0.0.0: localhost, 127.0.0.1, [::1]); others get 403, which stops DNS rebinding (repeatable; .example.com allows subdomains)")
    limits.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN", help="a browser page Origin allowed besides pages on an allowed host, e.g. https://app.example (repeatable; * allows any)")
    limits.add_argument("--token-secret", default=os.environ.get("LIVE_TOKEN_SECRET"), help="secret (32+ bytes) that signs session tokens: session.start must carry a JWT minted with it (live token, live.access.auth.mint_token) (default: $LIVE_TOKEN_SECRET)")
    limits.add_argument("--token-issuer", metavar="ISS", help="with --token-secret: a token's iss claim must be this (default: not checked)")
    limits.add_argument("--max-token-lifetime", type=_positive(float), default=3600.0, metavar="SECONDS", help="with --token-secret: refuse tokens valid for longer than this, from their iat or from now (default 3600)")
    limits.add_argument("--token", default=os.environ.get("LIVE_TOKEN"), help="a static shared token for development, accepted in session.start (default: $LIVE_TOKEN; none if unset)")
    limits.add_argument("--start-timeout", type=_positive(float), default=10.0, help="seconds a socket may take to send session.start (default 10)")
    limits.add_argument("--max-pending", type=_positive(int), default=32, help="sockets waiting for session.start at once (default 32)")
    limits.add_argument("--max-pending-per-ip", type=_positive(int), default=8, help="of those, sockets from one client address, an IPv6 client by its /64 (default 8)")
    limits.add_argument("--max-sessions-per-ip", type=_positive(int), default=10, help="sockets per client address, an IPv6 client by its /64 (default 10; behind a proxy see --forwarded-allow-ips)")
    limits.add_argument("--forwarded-allow-ips", default="127.0.0.1,::1", metavar="IPS", help="comma-separated proxy addresses or networks whose X-Forwarded-For names the client (* for any; default 127.0.0.1,::1): the client is the rightmost hop that is not one of them, and the per-address limits and /metrics judge it, not the proxy; a socket naming no client is the peer's own")
    limits.add_argument("--audio-lead", type=float, default=0.5, help="seconds of reply audio sent ahead of real time (default 0.5; 0 disables pacing)")
    limits.add_argument("--reattach-grace", type=_non_negative, default=30.0, metavar="SECONDS", help="how long a session whose client's socket dropped waits, model connection open, for the client to come back with session.resume (default 30; 0: end it at once)")
    limits.add_argument("--stall-timeout", type=_positive(float), default=20.0, help="seconds the model may owe a reply to a typed turn or tool result before the session is resumed on a new connection (default 20)")
    fleet = parser.add_argument_group("many servers (see docs/fleet.md)")
    fleet.add_argument(
        "--redis", dest="redis_url", metavar="URL", default=os.environ.get("LIVE_REDIS_URL") or None,
        help="share sessions with the other servers on this Redis (redis://[:PASSWORD@]HOST:PORT/DB, "
        "rediss:// for TLS): which server holds each session, what another needs to take it over, "
        "and the global session limit (default: $LIVE_REDIS_URL; none: this server alone)",
    )
    fleet.add_argument(
        "--fleet-key", action="append", metavar="SECRET",
        help="with --redis, required: a secret every server of the fleet shares (32+ bytes, e.g. "
        "python3 -c 'import secrets; print(secrets.token_hex(32))'); each session's facts "
        "(its conversation, the model session's handle) are encrypted with it before Redis sees "
        "them. Give it twice to change keys: the first encrypts, either decrypts "
        "(default: $LIVE_FLEET_KEY)",
    )
    fleet.add_argument(
        "--fleet-lease", type=_positive(float), default=1.5, metavar="SECONDS",
        help="how long a server's hold on its sessions lasts without renewal (renewed every third "
        "of it): after it dies, another server takes its sessions over this long later at most "
        "(default 1.5)",
    )
    fleet.add_argument(
        "--drain-timeout", type=_positive(float), default=30.0, metavar="SECONDS",
        help="on SIGTERM with --redis, how long to wait for each session to reach a safe point "
        "before handing it to another server anyway; without --redis, how long a Live API app's "
        "session may finish its reply after the goAway it is sent (default 30)",
    )
    fleet.add_argument(
        "--max-sessions-global", type=_positive(int), metavar="N",
        help="concurrent sessions across every server on the same --redis, e.g. the Gemini project's "
        "quota; a dead server's sessions stop counting when its lease runs out (default: no global limit)",
    )
    gemini = parser.add_argument_group("the Live API's own endpoint (see docs/gemini-endpoint.md)")
    gemini.add_argument("--gemini-endpoint", action="store_true", help="also serve the Live API's WebSocket paths (/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent and the v1alpha ones), so google-genai and @google/genai apps connect with only their base URL changed; the key they send is one of this server's tokens (serve it over TLS: --certfile)")
    gemini.add_argument("--gemini-model", action="append", default=[], metavar="PATTERN", help="with --gemini-endpoint: a model name (fnmatch pattern, without models/) a client may ask for in its setup; the session runs the server's model whichever it names (repeatable; default: the server's model)")
    gemini.add_argument("--gemini-policy", metavar="FILE", help="with --gemini-endpoint: a TOML file of what apps may ask: models, an instruction said before theirs, tools removed (see docs/gemini-endpoint.md)")
    gemini.add_argument("--mint-key", default=os.environ.get("LIVE_MINT_KEY"), help="with --gemini-endpoint and --token-secret: the key a backend presents to POST /v1alpha/auth_tokens (on --port, and --post-port if given), google-genai's client.auth_tokens.create, to mint ephemeral tokens for its apps (default: $LIVE_MINT_KEY; none: the route is not served)")
    phone = parser.add_argument_group("phone calls (see docs/phone.md)")
    phone.add_argument("--twilio", action="store_true", help="answer Twilio calls: the voice webhook POST /twilio/voice and the media stream /twilio/media, both on --port; the auth token comes from $TWILIO_AUTH_TOKEN")
    phone.add_argument("--telnyx", action="store_true", help="answer Telnyx calls: the Call Control webhook POST /telnyx/call answers with the media stream /telnyx/media, both on --port; keys from $TELNYX_API_KEY and $TELNYX_PUBLIC_KEY")
    phone.add_argument("--public-url", metavar="URL", help="the https:// address carriers reach this server at (a tunnel's in development); webhooks' signatures are checked against it")
    phone.add_argument("--post-port", "--phone-port", dest="post_port", type=int, metavar="PORT", help="also serve the POST routes (carriers' webhooks, the Live API's auth_tokens) on this port, for those who route them apart; they are served on --port either way (default: none)")
    phone.add_argument("--stream-url", metavar="URL", help="the wss:// address of the media stream, when it is not --public-url with /twilio/media (or /telnyx/media) after its path")
    phone.add_argument("--twilio-shared-key", default=os.environ.get("TWILIO_WEBHOOKS_SHARED_KEY"), metavar="SECRET", help="the secret of a Twilio Webhooks Rule's SharedKey: webhooks that carry X-Twilio-Webhooks-Signature-Settings are checked with it and the algorithm it names (HMAC_SHA256) (default: $TWILIO_WEBHOOKS_SHARED_KEY)")
    phone.add_argument("--telnyx-codec", choices=("PCMU", "PCMA", "L16"), default="PCMU", help="what Telnyx streams the caller in and plays the agent's replies in: PCMU or PCMA (8 kHz), or L16 (16 kHz: wideband, started with streaming_start, the command that can say the rate) (default PCMU)")
    phone.add_argument("--transfers", metavar="FILE", help="a TOML file of the destinations transfer_call may send a caller to: [destinations] name = \"+15551234567\"; any other is refused")
    phone.add_argument("--busy", choices=("say", "reject", "fallback"), default="say", help="what a caller hears when the server is full or stopping: say (a sentence, then hang up), reject (a busy tone; Twilio does not bill it), fallback (503: the carrier's fallback / failover URL) (default say)")
    phone.add_argument("--busy-message", default="Sorry, all our lines are busy. Please call again later.", metavar="TEXT", help="the sentence of --busy say")
    phone.add_argument("--call-drain-timeout", type=_non_negative, default=600.0, metavar="SECONDS", help="on SIGTERM, how long calls may go on (new ones are refused) before the agent says goodbye and hangs up (default 600)")
    tls = parser.add_argument_group("TLS (so browsers on other machines may use the microphone)")
    tls.add_argument("--certfile", help="PEM certificate chain: serve https:// and wss:// directly")
    tls.add_argument("--keyfile", help="PEM private key of --certfile (if not in the same file)")
    parser.add_argument(
        "--workers", type=_positive(int), default=1,
        help="server processes sharing the port (SO_REUSEPORT, Linux), about one core each; "
        "--max-sessions applies to each (default 1)",
    )
    parser.add_argument(
        "--loop", choices=LOOPS, default=os.environ.get("LIVE_LOOP", "auto"),
        help="event loop: uvloop costs less CPU per session than asyncio's own; auto: uvloop where "
        "installed (default: $LIVE_LOOP, else auto)",
    )
    parser.add_argument(
        "--sockets", choices=LAYERS, default=os.environ.get("LIVE_SOCKETS", "auto"),
        help="WebSocket layer: picows frames in compiled code (about 0.6x the CPU); websockets "
        "where picows has no wheels; auto: picows where it can be imported (default: $LIVE_SOCKETS, else auto)",
    )
    seeing = parser.add_argument_group("seeing what it does")
    seeing.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus /metrics on this port instead of the serving port (0 picks a free one)")
    seeing.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST", help="interface --metrics-port listens on (default 127.0.0.1)")
    seeing.add_argument("--metrics-allow-ips", default="", metavar="IPS", help="comma-separated addresses or networks that may read /metrics besides loopback (* for any; by the client's address, behind a trusted proxy the client it names, never the Host header)")
    seeing.add_argument("--record", metavar="DIR", help="write a record of every session to DIR (events as JSONL, audio as WAV); read one with `live record show`")
    seeing.add_argument("--record-session-mb", type=_positive(float), default=50.0, help="a session's record stops at this size (default 50 MB)")
    seeing.add_argument("--record-total-mb", type=_positive(float), default=1024.0, help="no new session is recorded while DIR holds this much (default 1024 MB)")
    seeing.add_argument(
        "--log-level", default="INFO", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        metavar="LEVEL",
        help="how much the log says: debug, info, warning or error, in any case (default info: a line per session's start and end)",
    )
    seeing.add_argument("--log-format", default="text", choices=["text", "json"], help="json: one object per line, with the session id (default text)")
    # Set by the first process on the workers it starts.
    parser.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    return parser


def _max_sessions(args: argparse.Namespace, model: str) -> int:
    """`--max-sessions`, measured when auto (said in the log once the server serves)."""
    if args.max_sessions != "auto":
        return int(args.max_sessions)
    args.capacity_found = capacity.estimate(model=model)
    return args.capacity_found.sessions


def _with_turn_taking(agent: Agent, args: argparse.Namespace) -> Agent:
    """The agent with the turn-taking the command line asks for; a server that
    would take turns itself without its models installed fails here, at start."""
    settings = agent.turns
    changes = {}
    if args.end_of_turn is not None:
        changes["end_of_turn"] = args.end_of_turn
    if args.end_silence is not None:
        changes["end_silence"] = args.end_silence
        changes["max_pause"] = max(settings.max_pause, args.end_silence)
    try:
        if changes:
            settings = dataclasses.replace(settings, **changes)
        agent = dataclasses.replace(agent, turn_taking=args.turn_taking or agent.turn_taking, turns=settings)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if agent.turn_taking == "server" or settings.end_of_turn == "smart":
        from live.engine.turns.models import SILERO, SMART_TURN, packaged_file
        from live.extras import MissingExtra, require

        try:
            require("turns", "--turn-taking server", "onnxruntime")
            for model in (SILERO, SMART_TURN) if settings.end_of_turn == "smart" else (SILERO,):
                packaged_file(*model)
        except (MissingExtra, RuntimeError) as exc:
            if agent.turn_taking == "server":
                raise UsageError(str(exc)) from None
    return agent


def load_agent(spec: str) -> Agent:
    try:
        return agent_at(spec)
    except ValueError as exc:
        raise UsageError(f"--agent {exc}") from None


def resolve(args: argparse.Namespace, registry: LlmRegistry) -> LiveServer:
    if args.agent:
        agent = load_agent(args.agent)
        if args.model:
            agent = agent.with_model(args.model)
    else:
        agent = Agent(name="assistant", model=args.model or DEFAULT_MODEL, instruction=DEFAULT_INSTRUCTION)
    agent = _with_turn_taking(agent, args)
    if args.keyfile and not args.certfile:
        raise UsageError("--keyfile needs --certfile")
    if args.certfile:
        try:
            tls_context(args.certfile, args.keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"--certfile/--keyfile: cannot load them: {exc}") from None
    token_secret = args.token_secret or None
    if token_secret is not None:
        try:
            check_secret(token_secret)
        except ValueError as exc:
            raise UsageError(f"--token-secret: {exc}") from None
    for flag, value in (("--forwarded-allow-ips", args.forwarded_allow_ips), ("--metrics-allow-ips", args.metrics_allow_ips)):
        try:
            AddressSet.parse([value])
        except ValueError as exc:
            raise UsageError(f"{flag}: {exc}") from None
    pool = agent.backends
    if args.backends:
        try:
            pool = BackendPool.load(args.backends)
        except PoolError as exc:
            raise UsageError(f"--backends {exc}") from None
    llm_at = None
    if pool is not None:
        # Every backend's model now: a key missing from the environment fails here.
        try:
            targets = pool.targets(agent.model)
        except PoolError as exc:
            raise UsageError(f"backends: {exc}") from None
        placed = {}
        for target in targets:
            try:
                placed[target] = registry.resolve_at(target.model, target.backend)
            except (UnknownModelError, AmbiguousModelError, LiveError, MissingExtra) as exc:
                raise UsageError(f"backend {target.name!r}: {exc}") from None
        llm_at = placed.__getitem__
        llm = placed[targets[0]]
    else:
        try:
            llm = registry.resolve(agent.model)
        except (UnknownModelError, AmbiguousModelError, LiveError, MissingExtra) as exc:
            raise UsageError(str(exc)) from None
    if args.max_image_bytes is not None and args.max_image_bytes > image_bytes_fitting(args.max_frame_bytes):
        raise UsageError(
            f"--max-image-bytes {args.max_image_bytes}: an image that size, as base64 in its "
            f"message, does not fit in --max-frame-bytes {args.max_frame_bytes}; raise "
            "--max-frame-bytes or lower --max-image-bytes"
        )
    lines = args.phone_lines = _phone_lines(args, agent, token_secret)
    config = ServerConfig(
        host=args.host,
        port=args.port,
        max_sessions=_max_sessions(args, agent.model),
        near_capacity=args.near_capacity,
        max_frame_bytes=args.max_frame_bytes,
        max_image_bytes=args.max_image_bytes,
        max_image_rate=args.max_image_rate,
        idle_timeout=args.idle_timeout,
        allowed_hosts=tuple(args.allow_host) + tuple(sorted(lines.public_hosts if lines else ())),
        allowed_origins=tuple(args.allow_origin),
        token=args.token or None,
        token_secret=token_secret,
        token_issuer=args.token_issuer or None,
        max_token_lifetime=args.max_token_lifetime,
        start_timeout=args.start_timeout,
        max_pending=args.max_pending,
        max_pending_per_ip=args.max_pending_per_ip,
        max_sessions_per_ip=args.max_sessions_per_ip,
        forwarded_allow_ips=tuple(args.forwarded_allow_ips.split(",")),
        metrics_allow_ips=tuple(args.metrics_allow_ips.split(",")),
        audio_lead=args.audio_lead if args.audio_lead > 0 else None,
        stall_timeout=args.stall_timeout,
        reattach_grace=args.reattach_grace,
        drain_timeout=args.drain_timeout,
        reuse_port=args.workers > 1,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        sockets=args.sockets,
        certfile=args.certfile,
        keyfile=args.keyfile,
        call_drain_timeout=args.call_drain_timeout,
    )
    recorder = None
    if args.record:
        try:
            recorder = Recorder(
                args.record,
                session_cap=int(args.record_session_mb * 1e6),
                total_cap=int(args.record_total_mb * 1e6),
            )
        except OSError as exc:
            raise UsageError(f"--record {args.record}: {exc.strerror or exc}") from None
    doors = lines.mounted_on(DEFAULT_DOORS) if lines else None
    posts: dict[str, Handler] = dict(lines.webhooks) if lines else {}
    if args.gemini_endpoint:
        policy = GeminiPolicy()
        if args.gemini_policy:
            try:
                policy = GeminiPolicy.load(args.gemini_policy)
            except PolicyError as exc:
                raise UsageError(f"--gemini-policy {exc}") from None
        models = args.gemini_model or ([] if policy.models else [agent.model.removeprefix("models/")])
        policy = policy.with_models(models)
        doors = {**(doors or DEFAULT_DOORS), **gemini_doors(policy=policy, model=agent.model)}
        if args.mint_key:
            if token_secret is None:
                raise UsageError("--mint-key mints signed tokens: it needs --token-secret (or $LIVE_TOKEN_SECRET)")
            from live.doors.gemini_tokens import AuthTokenMinter

            try:
                minter = AuthTokenMinter(
                    args.mint_key, token_secret, allowed_models=policy.models, agent=agent.name,
                    issuer=args.token_issuer or None, max_lifetime=args.max_token_lifetime,
                )
            except ValueError as exc:
                raise UsageError(f"--mint-key: {exc} (make one with: python3 -c 'import secrets; print(secrets.token_hex(32))')") from None
            # On every version the SDKs post to (the service answers v1alpha and v1beta).
            for version in ("v1alpha", "v1beta", "v1"):
                posts[AUTH_TOKENS_PATH.replace("v1alpha", version)] = minter.answer
    elif args.gemini_model or args.gemini_policy:
        raise UsageError("--gemini-model and --gemini-policy need --gemini-endpoint")
    if not posts and args.post_port is not None:
        raise UsageError("--post-port serves phone webhooks (--twilio, --telnyx) and auth_tokens (--gemini-endpoint --mint-key): add one")
    args.post_routes = posts
    # The POST routes are served on the WebSocket port itself (one address for a
    # carrier's webhook and its stream), and on --post-port too when given.
    server = LiveServer(agent, llm, config, recorder=recorder, agent_spec=args.agent, doors=doors,
                        posts=posts or None, pool=pool, llm_at=llm_at)
    if lines is not None:
        lines.refuse_when(server.call_refusal)
        lines.count_with(server.metrics)
    return server


# A secret that signs the tokens of calls, shared by the worker processes (a
# webhook answered by one, the call's stream taken by another).
CALL_SECRET_ENV = "LIVE_CALL_TOKEN_SECRET"


def _phone_lines(args: argparse.Namespace, agent: Agent, token_secret: str | None) -> PhoneLines | None:
    if not (args.twilio or args.telnyx):
        if args.public_url or args.stream_url:
            raise UsageError("--public-url and --stream-url are for phone calls: add --twilio or --telnyx")
        return None
    flag = "--twilio" if args.twilio else "--telnyx"
    try:
        require("phone", flag, "twilio", "h11", "cryptography")
    except MissingExtra as exc:
        raise UsageError(str(exc)) from None
    if not args.public_url or urlsplit(args.public_url).scheme not in ("https", "http") or not urlsplit(args.public_url).hostname:
        raise UsageError(f"{flag} needs --public-url https://NAME, the address the carrier reaches this server at")
    if args.twilio and args.telnyx and args.stream_url:
        raise UsageError("--stream-url names one carrier's stream: with both --twilio and --telnyx, route both through --public-url")
    secret = token_secret or os.environ.get(CALL_SECRET_ENV)
    if secret is None:
        secret = os.environ[CALL_SECRET_ENV] = secrets.token_urlsafe(32)
    from live.phone.calls import CallTokens
    from live.phone.control import TransferRefused, load_destinations
    from live.phone.lines import PhoneLines

    destinations: dict[str, str] = {}
    if args.transfers:
        try:
            destinations = load_destinations(args.transfers)
        except TransferRefused as exc:
            raise UsageError(f"--transfers {exc}") from None
    lines = PhoneLines(tokens=CallTokens(secret, agent=agent.name), on_key_press=agent.on_key_press,
                       key_entry=agent.key_entry, destinations=destinations, busy=args.busy)
    try:
        if args.twilio:
            auth_token = os.environ.get("TWILIO_AUTH_TOKEN", "")
            if not auth_token:
                raise UsageError("--twilio needs the account's auth token in $TWILIO_AUTH_TOKEN (Twilio console, Account Info)")
            from live.phone.control import TwilioCallControl

            # With the account's id the agent's call-control tools can act (end_call,
            # transfer_call), and a session that ends here hangs its call up.
            account_sid = os.environ.get("TWILIO_ACCOUNT_SID")
            control = TwilioCallControl(account_sid, auth_token) if account_sid else None
            lines.add_twilio(auth_token, args.public_url, stream_url=args.stream_url, control=control,
                             shared_key=args.twilio_shared_key or None)
        if args.telnyx:
            api_key, public_key = os.environ.get("TELNYX_API_KEY", ""), os.environ.get("TELNYX_PUBLIC_KEY", "")
            if not api_key or not public_key:
                raise UsageError("--telnyx needs $TELNYX_API_KEY (answers calls) and $TELNYX_PUBLIC_KEY (checks webhooks), "
                                 "both from the Telnyx portal")
            lines.add_telnyx(public_key, api_key, args.public_url, stream_url=args.stream_url,
                             api_base_url=os.environ.get("TELNYX_API_BASE_URL", "https://api.telnyx.com/v2"),
                             codec=args.telnyx_codec, connection_id=os.environ.get("TELNYX_CONNECTION_ID") or None)
    except ValueError as exc:  # a public or stream URL no carrier can open a stream on
        raise UsageError(f"{'--stream-url' if args.stream_url else '--public-url'}: {exc}") from None
    for webhook in (lines.twilio_webhook, lines.telnyx_webhook):
        if webhook is not None:
            webhook.busy_message = args.busy_message
    return lines


async def _serve(server: LiveServer, args: argparse.Namespace, argv: list[str]) -> None:
    if args.redis_url:
        # Before listening: a Redis that cannot be reached is a one-line error at start.
        store = await open_store(args.redis_url, facts_key=args.facts_key)
        server.fleet = Fleet(
            store,
            address="",
            lease_seconds=args.fleet_lease,
            reattach_grace=args.reattach_grace,
            max_sessions_global=args.max_sessions_global,
        )
        lines = getattr(args, "phone_lines", None)
        if lines is not None:
            lines.tokens.store = store  # a call's token is minted and spent once across the fleet
        try:
            await _serve_now(server, args, argv)
        finally:
            with anyio.CancelScope(shield=True):
                await store.aclose()
        return
    await _serve_now(server, args, argv)


async def _serve_now(server: LiveServer, args: argparse.Namespace, argv: list[str]) -> None:
    async with anyio.create_task_group() as tg:

        async def stop_on_signal() -> None:
            # The receiver stays open until the server has stopped, so a second
            # signal (Ctrl-C reaches every worker, then the first one relays
            # SIGTERM) cannot kill a process in the middle of closing sessions.
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    if not server.stopping:
                        logging.getLogger("live.server").info("stopping: closing every session")
                        server.stop()

        async def serve(*, task_status: anyio.abc.TaskStatus[int]) -> None:
            await server.serve(task_status=task_status)
            tg.cancel_scope.cancel()  # stopped: the signal watcher is no longer needed

        tg.start_soon(stop_on_signal)
        port = await tg.start(serve)
        lines = getattr(args, "phone_lines", None)
        if lines is not None:
            await tg.start(lines.run)  # the carriers' commands the webhooks decided on
        posts = getattr(args, "post_routes", None)
        webhooks = None
        if posts and args.post_port is not None:
            webhooks = PostListener(
                posts, server.config.host, args.post_port, reuse_port=args.workers > 1,
                ssl_context=tls_context(args.certfile, args.keyfile) if args.certfile else None,
                client_key=address_key,
            )
            args.post_port = await tg.start(webhooks.serve)
        logger = logging.getLogger("live.server")
        logger.info("event loop: %s", type(asyncio.get_running_loop()).__module__.split(".")[0])
        found = getattr(args, "capacity_found", None)
        if found is not None:
            logger.info("%s", found.describe())
        if args.worker_index:
            _stop_with_the_first_process()
            print("ready", flush=True)  # read by the first process (see _start_workers)
            return
        extra = ["--port", str(port)]
        if server.metrics_port is not None:
            extra += ["--metrics-port", str(server.metrics_port)]
        if webhooks is not None:
            extra += ["--post-port", str(args.post_port)]
        workers = await _start_workers([*argv, *extra], args.workers - 1)
        host = server.config.host
        shown = f"[{host}]" if ":" in host else host
        web = server.config.scheme
        print(server.serving_line(args.workers), flush=True)
        if host in ("0.0.0.0", "::", ""):
            names = [h for h in server.config.allowed_hosts if h != "*" and not h.startswith(".")]
            elsewhere = (
                f"at {web}://{names[0]}:{port}/" if names
                else "by a name given with --allow-host NAME (the Host check refuses others)"
            )
            print(f"live: listening on every interface ({host or '0.0.0.0'}): other machines reach it {elsewhere}", flush=True)
        if not server.backends.single_target:
            shared = " (breakers shared on --redis)" if server.fleet is not None else ""
            where = ", ".join(str(t) for t in server.backends.targets)
            print(f"live: backends, in order: {where}{shared}", flush=True)
        if server.metrics_port is not None:
            metrics_host = server.config.metrics_host
            metrics_shown = f"[{metrics_host}]" if ":" in metrics_host else metrics_host
            print(f"live: metrics on http://{metrics_shown}:{server.metrics_port}/metrics", flush=True)
        ports = f"{port} and {args.post_port}" if webhooks is not None else f"{port}"
        if lines is not None and lines.twilio_webhook is not None:
            print(
                f"live: Twilio voice webhook {lines.twilio_webhook.public_url}/twilio/voice (served on port "
                f"{ports}), media stream {lines.twilio_webhook.stream_url}",
                flush=True,
            )
        if lines is not None and lines.telnyx_webhook is not None:
            print(
                f"live: Telnyx call webhook {args.public_url.rstrip('/')}/telnyx/call (served on port "
                f"{ports}), media stream {lines.telnyx_webhook.stream_url}",
                flush=True,
            )
        if posts and AUTH_TOKENS_PATH in posts:
            print(
                f"live: Live API auth_tokens on {web}://{shown}:{args.post_port if webhooks is not None else port}"
                "/v1alpha/auth_tokens (and /v1beta/, /v1/: google-genai's client.auth_tokens.create, with the --mint-key)",
                flush=True,
            )
        live_api = next((door for door in server.doors.values() if getattr(door, "name", "") == "gemini"), None)
        if live_api is not None:
            models = ", ".join(live_api.allowed_models) or "none"
            print(f"live: Live API endpoint: base URL {web}://{shown}:{port} for google-genai and @google/genai apps (models: {models})", flush=True)
            if web != "https":
                print(
                    "live: warning: the Live API endpoint is served without TLS, and google-genai dials only "
                    "wss://: its apps cannot connect. Serve it with --certfile/--keyfile, or behind a TLS proxy.",
                    flush=True,
                )
        tg.start_soon(_stop_workers_with, server, workers)
        after_ready = getattr(args, "after_ready", None)
        if after_ready is not None:  # `live call`: place the call once the server answers
            tg.start_soon(after_ready, server, args)
        if server.agent.model == DEFAULT_MODEL and (
            os.environ.get("GOOGLE_API_KEY") or os.environ.get("GEMINI_API_KEY")
        ):
            print("live: an API key is set; pass --model gemini-... to talk to Gemini", flush=True)


async def _start_workers(argv: list[str], count: int) -> list[subprocess.Popen[bytes]]:
    """The other processes of `--workers`: the same command, on the port now bound.

    Returns once each one listens, so the port is shared from the first client on.
    """
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "live.cli", "serve", *argv, "--worker-index", str(index)],
            stdin=subprocess.PIPE,  # never written: its end tells the worker this process is gone
            stdout=subprocess.PIPE,
        )
        for index in range(1, count + 1)
    ]
    for index, worker in enumerate(workers, start=1):
        assert worker.stdout is not None
        with anyio.move_on_after(60):
            line = await anyio.to_thread.run_sync(worker.stdout.readline, abandon_on_cancel=True)
            if line.strip() == b"ready":
                continue
        logging.getLogger("live.server").error(
            "worker %d did not start (exit code %s); serving with fewer processes",
            index,
            worker.poll(),
        )
    return workers


def _stop_with_the_first_process() -> None:
    """A worker stops as on SIGTERM when the first process is gone, even killed
    outright: its stdin is a pipe from that process, never written, which ends
    when that process does. No worker outlives the command or holds its port."""

    def watch() -> None:
        sys.stdin.buffer.read()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="first process watch", daemon=True).start()


async def _stop_workers_with(server: LiveServer, workers: list[subprocess.Popen[bytes]]) -> None:
    """When this process stops, stop the workers it started and wait for them."""
    if not workers:
        return
    try:
        await server.wait_stopping()
    finally:
        with anyio.CancelScope(shield=True):
            for worker in workers:
                if worker.poll() is None:
                    worker.terminate()
            config = server.config
            draining = max(config.call_drain_timeout + config.goodbye_timeout, config.drain_timeout)
            deadline = anyio.current_time() + config.shutdown_grace + draining + 5
            for worker in workers:
                while worker.poll() is None and anyio.current_time() < deadline:
                    await anyio.sleep(0.05)
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
                worker_stopped(worker.pid)


def main(argv: list[str], *, after_ready: Callable[..., Any] | None = None) -> int:
    """`live serve`; `after_ready(server, args)` runs in the server's task group once it listens."""
    args = build_parser().parse_args(argv)
    args.after_ready = after_ready
    logs.configure(args.log_level, args.log_format, args.worker_index if args.workers > 1 else None)
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        print(f"live serve: --metrics-port must be a port number, not {args.metrics_port}", file=sys.stderr)
        return 2
    metrics_dir = None
    if args.workers > 1 and not args.worker_index and not multiprocess_enabled():
        # Before any metric exists: every process writes its figures here, and
        # /metrics on any of them adds them up.
        metrics_dir = enable_multiprocess()
    try:
        return _run(args, argv)
    finally:
        if metrics_dir is not None:
            remove_multiprocess_dir(metrics_dir)


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    try:
        server = resolve(args, default_registry())
    except UsageError as exc:
        print(f"live serve: {exc}", file=sys.stderr)
        return 2
    if args.max_sessions_global is not None and not args.redis_url:
        print("live serve: --max-sessions-global needs --redis (the servers share the count there)", file=sys.stderr)
        return 2
    try:
        args.facts_key = _facts_key(args)
    except (UsageError, StoreError) as exc:
        print(f"live serve: {exc}", file=sys.stderr)
        return 2
    try:
        options = backend_options(args.loop)
    except LoopUnavailable as exc:
        print(f"live serve: --loop {args.loop}: {exc}", file=sys.stderr)
        return 2
    tune_gc_for_serving()
    try:
        anyio.run(_serve, server, args, argv, backend_options=options)
    except StoreError as exc:  # Redis unreachable, or not a Redis URL
        print(f"live serve: {exc}", file=sys.stderr)
        return 1
    except (OSError, BaseExceptionGroup) as exc:
        error = _os_error(exc)
        if error is None:
            raise
        print(f"live serve: cannot listen on {args.host}:{args.port}: {error.strerror or error}", file=sys.stderr)
        return 1
    return 0


FLEET_KEY_ENV = "LIVE_FLEET_KEY"


def _facts_key(args: argparse.Namespace) -> FactsKey | None:
    """The key a fleet's facts are sealed with; with --redis there must be one.

    Redis would otherwise hold every conversation in clear (its text, the
    model session's handle that resumes it), for anyone who can read Redis or
    a copy of it; and a fleet that stored less could not carry a conversation on.
    """
    if not args.redis_url:
        return None
    try:
        require("fleet", "--redis", "redis", "cryptography")
    except MissingExtra as exc:
        raise UsageError(str(exc)) from None
    secrets_given = args.fleet_key or ([os.environ[FLEET_KEY_ENV]] if os.environ.get(FLEET_KEY_ENV) else [])
    if not secrets_given:
        raise UsageError(
            "--redis needs --fleet-key (or $LIVE_FLEET_KEY): a secret every server of the fleet shares, which "
            "encrypts the conversations Redis holds (make one with: python3 -c 'import secrets; "
            "print(secrets.token_hex(32))')"
        )
    try:
        return FactsKey(*secrets_given)
    except ValueError as exc:
        raise UsageError(f"--fleet-key: {exc}") from None


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError behind a failure to listen, unwrapped from task-group errors."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _os_error(inner)
            if found is not None:
                return found
    return None
