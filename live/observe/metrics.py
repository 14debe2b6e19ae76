"""The server's Prometheus metrics, and how they are exposed.

One `Metrics` object holds every metric the server exports. It registers them
in a registry of its own (so several servers in one process, as in tests, keep
their figures apart), or in prometheus-client's default registry for code that
already exposes that one (`Metrics.default()`).

Across `live serve --workers N` the figures must add up: the first process
calls `enable_multiprocess(directory)` before any metric exists, every worker
inherits the directory through `PROMETHEUS_MULTIPROC_DIR`, each writes its
values to its own files there, and `/metrics` on any of them reads them all
(prometheus-client's multiprocess mode).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from google.genai import types
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)

from live.protocol import ErrorEvent

__all__ = [
    "Metrics",
    "enable_multiprocess",
    "end_reason_code",
    "multiprocess_enabled",
]

ENV = "PROMETHEUS_MULTIPROC_DIR"

LATENCY_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
TOOL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONNECT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


def multiprocess_enabled() -> bool:
    return bool(os.environ.get(ENV))


def enable_multiprocess(directory: str | os.PathLike[str] | None = None) -> Path:
    """Switch this process (and the workers it starts) to multiprocess metrics.

    Must run before the first metric is created. Without `directory` a fresh
    temporary one is made (the caller removes it: `remove_multiprocess_dir`).
    Stale value files of an earlier run in a given directory are removed, as
    prometheus-client requires.
    """
    if directory is None:
        path = Path(tempfile.mkdtemp(prefix="live-metrics-"))
    else:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()
    os.environ[ENV] = str(path)
    # prometheus-client picks its value class from the environment when it is
    # imported; this process imported it before the directory was known.
    values.ValueClass = values.get_value_class()
    return path


def remove_multiprocess_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def worker_stopped(pid: int) -> None:
    """A worker process ended: its share of live gauges no longer counts."""
    if multiprocess_enabled():
        multiprocess.mark_process_dead(pid)


# Session end reasons as a closed set of label values: the reason text of a
# session varies (it names limits and model errors), a label must not.
_FIXED_REASONS = {
    "client closed the session": "client_closed",
    "client disconnected": "client_disconnected",
    "client disconnected before session.start": "client_disconnected",
    "idle timeout": "idle_timeout",
}


def end_reason_code(reason: str, error: ErrorEvent | None) -> str:
    """A short, stable label for why a session ended."""
    if error is not None:
        return error.code
    if reason in _FIXED_REASONS:
        return _FIXED_REASONS[reason]
    if reason.startswith("client too slow"):
        return "client_too_slow"
    if reason.startswith("model"):
        return "model_error"
    return "other"


class Metrics:
    """Every metric of the server, created once per server (or process).

    Label values are bounded: models and agents are what the server was
    configured with, tools what the agent declares (calls to other names are
    counted as `other`), end reasons and error codes come from closed sets.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.sessions_active = Gauge(
            "live_sessions_active",
            "Client sessions open now (sockets on /live).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.sessions = Counter(
            "live_sessions",
            "Client sessions ended, by model, agent and why they ended.",
            ["model", "agent", "end_reason"],
            registry=r,
        )
        # By front door (its `name`: live, twilio, telnyx, ...): phone calls beside
        # browser sessions, per carrier. Separate from `live_sessions` so its
        # labels, and the dashboards built on them, stay as they were.
        self.door_sessions_active = Gauge(
            "live_door_sessions_active",
            "Client sessions open now, by the front door they came through.",
            ["door"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.door_sessions = Counter(
            "live_door_sessions",
            "Client sessions ended, by the front door they came through and why they ended.",
            ["door", "end_reason"],
            registry=r,
        )
        # Phone lines: how each carrier's webhooks were answered (a stream, a busy
        # answer, refused for its signature or as a replay...) and the calls'
        # progress as the carriers report it. Both closed sets; no call's id.
        self.phone_webhooks = Counter(
            "live_phone_webhooks",
            "Carrier webhooks, by carrier and how the server answered them.",
            ["carrier", "answer"],
            registry=r,
        )
        self.phone_call_status = Counter(
            "live_phone_call_status",
            "Calls' progress as the carriers report it (status callbacks and events), by carrier and status.",
            ["carrier", "status"],
            registry=r,
        )
        self.turn_latency = Histogram(
            "live_turn_latency_seconds",
            "From the end of the user's turn (activity.end, a typed turn, or the "
            "model's voice detection) to the first reply audio sent to the client.",
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.first_audio = Histogram(
            "live_first_audio_seconds",
            "From session.start to the first reply audio sent to the client.",
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.reconnects = Counter(
            "live_model_reconnects",
            "Sessions moved to a new model connection, by cause "
            "(go_away, connection_lost, stalled, closed).",
            ["cause"],
            registry=r,
        )
        self.client_frames = Counter(
            "live_client_frames",
            "WebSocket frames between clients and the server (in: from clients).",
            ["direction"],
            registry=r,
        )
        self.audio_dropped = Counter(
            "live_audio_dropped_frames",
            "Audio frames dropped: overflow (client audio the model could not "
            "take), interrupted (reply audio queued at a barge-in), late (reply "
            "audio arriving after a barge-in), held (client audio beyond the bound "
            "while a model that takes no input during a tool call waited for its result).",
            ["reason"],
            registry=r,
        )
        self.interruptions = Counter(
            "live_interruptions", "Replies interrupted by the user (barge-in).", registry=r
        )
        self.user_turns = Counter(
            "live_user_turns",
            "User turns the server ended (turn_taking server), by why: silence, complete, "
            "max_wait, max_length, audio_end; backchannel: speech over a reply left alone.",
            ["reason"],
            registry=r,
        )
        self.turn_taking_cpu = Counter(
            "live_turn_taking_cpu_seconds",
            "CPU time the server's own turn-taking spent (turn_taking server, and conversation "
            "policies that listen for the user), by part: voice_detection (Silero's runs, the "
            "batching, each session's handling of its scores), end_of_turn (Smart Turn).",
            ["part"],
            registry=r,
        )
        self.tool_calls = Counter(
            "live_tool_calls",
            "Tool calls answered, by tool, where they ran, and outcome "
            "(ok, error, timeout, cancelled).",
            ["tool", "runs_on", "outcome"],
            registry=r,
        )
        self.tool_duration = Histogram(
            "live_tool_duration_seconds",
            "From the model's call to its answer (or cancellation).",
            ["tool"],
            registry=r,
            buckets=TOOL_BUCKETS,
        )
        self.tokens = Counter(
            "live_tokens",
            "Tokens the model reported in usage metadata, by kind (prompt, response, "
            "cached, thoughts, tool_use_prompt) and modality (unspecified where the "
            "model gives no breakdown).",
            ["model", "kind", "modality"],
            registry=r,
        )
        self.errors = Counter(
            "live_errors", "Error events sent to clients, by code.", ["code"], registry=r
        )
        self.model_connects = Counter(
            "live_model_connects",
            "Model connections opened, by model and outcome (ok, or the error type).",
            ["model", "outcome"],
            registry=r,
        )
        self.model_connect_seconds = Histogram(
            "live_model_connect_seconds",
            "Time to open a model connection.",
            ["model"],
            registry=r,
            buckets=CONNECT_BUCKETS,
        )
        self.model_messages = Counter(
            "live_model_messages",
            "Messages between the server and the model (in: from the model).",
            ["model", "direction"],
            registry=r,
        )
        # Backends of a pool (`live.backends`; without one, the one backend
        # "default"): labels are the pool's backend names and closed sets of causes.
        self.backend_sessions = Gauge(
            "live_backend_sessions_active",
            "Sessions whose model connection is on a backend now.",
            ["backend"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.backend_failures = Counter(
            "live_backend_failures",
            "Model connections that failed on a backend, by cause (quota, model_missing, "
            "unreachable, refused, unavailable, dropped).",
            ["backend", "cause"],
            registry=r,
        )
        self.backend_moves = Counter(
            "live_backend_moves",
            "Sessions carried away from a backend to another of the pool, by cause (quota, "
            "model_missing, unreachable, refused, unavailable, breaker_open).",
            ["backend", "cause"],
            registry=r,
        )
        self.backend_breaker = Gauge(
            "live_backend_breaker_state",
            "A backend's circuit breaker as this server last saw it: 0 closed, 1 half-open, 2 open.",
            ["backend"],
            registry=r,
            multiprocess_mode="livemax",
        )
        # Pre-bound children for the per-frame paths: a label lookup costs more
        # than the increment.
        self.frames_in = self.client_frames.labels("in")
        self.frames_out = self.client_frames.labels("out")
        self.dropped_overflow = self.audio_dropped.labels("overflow")
        self.dropped_interrupted = self.audio_dropped.labels("interrupted")
        self.dropped_late = self.audio_dropped.labels("late")
        self.dropped_held = self.audio_dropped.labels("held")

    _default: Metrics | None = None

    @classmethod
    def default(cls) -> Metrics:
        """One instance on prometheus-client's default registry, for library use."""
        if cls._default is None:
            from prometheus_client import REGISTRY

            cls._default = cls(REGISTRY)
        return cls._default

    def count_usage(self, model: str, usage: types.UsageMetadata) -> None:
        """Add one usage report: every kind, split by modality where given."""
        for kind, total, details in (
            ("prompt", usage.prompt_token_count, usage.prompt_tokens_details),
            ("response", usage.response_token_count, usage.response_tokens_details),
            ("cached", usage.cached_content_token_count, usage.cache_tokens_details),
            ("tool_use_prompt", usage.tool_use_prompt_token_count, usage.tool_use_prompt_tokens_details),
            ("thoughts", usage.thoughts_token_count, None),
        ):
            if not total and not details:
                continue
            counted = 0
            for item in details or ():
                if item.token_count:
                    modality = item.modality.value.lower() if item.modality else "unspecified"
                    self.tokens.labels(model, kind, modality).inc(item.token_count)
                    counted += item.token_count
            rest = (total or 0) - counted
            if rest > 0:
                self.tokens.labels(model, kind, "unspecified").inc(rest)

    def exposition(self) -> tuple[bytes, str]:
        """The text format for `/metrics`: this registry, or every process's files."""
        if multiprocess_enabled():
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def value(self, name: str, labels: dict[str, Any] | None = None) -> float:
        """One sample's current value in this process (0 when absent), for tests."""
        found = self.registry.get_sample_value(name, {k: str(v) for k, v in (labels or {}).items()})
        return found or 0.0
