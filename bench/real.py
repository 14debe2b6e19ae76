"""The real Gemini path: `live serve` as a user runs it, against the Live emulator over TLS.

    python -m bench.relay --real             # N = 10, 50, 100, 200; 15 s each
    python -m bench.relay --real --quick     # N = 2, 10; 3 s each
    python -m bench.relay --real --sessions 20 --duration 30 --json out.json
    python -m bench.relay --real --profile   # py-spy each relay at the largest N
    python -m bench.relay --real --baseline main   # and `live serve` as of main, beside
    python -m bench.relay --real --sessions 50 --repeat 3   # medians and ranges over 3 runs
    python -m bench.relay --real --workers 2   # `live serve --workers 2`
    python -m bench.relay --real --gemini-endpoint   # and the Live API's endpoint, beside /live

For every N, the same load through each peer, one run after another (never
together: the machine has two cores), each run with a fresh upstream:

- the upstream is `bench.emulator_load`: the Live emulator (the Gemini Live
  wire protocol over TLS, its own CA) with a load script: every session speaks
  continuously (24 kHz PCM16 in 40 ms audio-only `serverContent` chunks, each
  stamped with the time it was due), and cuts one turn in three with the
  model's `interrupted`; it times every 20 ms microphone frame it receives by
  the send time the frame carries (`bench.stats`);
- **direct**: N clients speak the Live protocol straight to the emulator
  (`setup`, `realtimeInput` audio as base64 JSON, `serverContent` back): the
  baseline, the least any relay's upstream side costs in latency;
- **live**: N `LiveClient`s -> `live serve --model gemini-live-2.5-flash-preview`
  (a subprocess started as a user starts it: GOOGLE_API_KEY,
  GOOGLE_GEMINI_BASE_URL and SSL_CERT_FILE point at the emulator; the
  google-genai SDK and TLS in the loop) -> the emulator;
- **live-endpoint** (with `--gemini-endpoint`): the same `live serve` with
  `--gemini-endpoint`, over TLS with a certificate made for the run (its own
  CA) and a token of the server's (`--token-secret`) as the clients' key: N
  clients speak the Live protocol to it exactly as `direct` speaks it to the
  emulator (the `gemini` adapter, with the token in GOOGLE_API_KEY and the
  run's CA in SSL_CERT_FILE), and it speaks it on to the emulator;
- every **reference peer** that is installed here (see below), e.g. ADK's
  `/run_live`, the same way.

With `--baseline REF`, `live@REF` runs beside them (`live serve` as of git
REF), and with `--gemini-endpoint` also `live-endpoint@REF`, unless REF's
`live serve` cannot serve it as this run does (a flag it lacks, tokens that
open one session each): then why is printed, and the rest of the run goes on.

"Added" latency is a peer's minus direct's, per direction and for
interruptions (the model's `interrupted` to the client's). CPU and RSS are the
peer process's own, children included (read from /proc); the emulator and the
generator are reported beside them (the emulator is Python too, and costs
about as much per session as a relay: on a small machine it limits N first).
RSS per session is the peer's growth from idle over N, so it includes the first
session's one-time growth (the SDK client, lazy imports) and reads high at
small N. A run is real time under the rule of
`bench.relay` (nothing later than 100 ms, nothing dropped, every session up,
the generator on schedule), and the emulator on schedule too (no step more
than 100 ms late): when it is not, the machine, not the relay, is the limit.

## Adding a peer (the seam for reference relays)

A peer is a subprocess command, its environment, and a client protocol:

    Peer(name, command, url, client_protocol, env={}, client_env={}, cwd=None,
         start_timeout=60.0)

`command` (argv) and `env` may use the placeholders `{port}` (a free loopback
port the peer must listen on; the run waits until it accepts connections),
`{base_url}`, `{ws_url}`, `{ca_file}`, `{api_key}` (the emulator's),
`{max_sessions}` (the run's N, at least 10) and `{python}` (this interpreter);
every peer process also gets GOOGLE_API_KEY, GOOGLE_GEMINI_BASE_URL and
SSL_CERT_FILE set for the emulator. `url` (same placeholders) is what the
clients dial; `client_protocol` names the adapter of
`bench.client_protocols` they speak it with (`live`, `gemini`, or
`module:attr` for the peer's own, run in the generator process with
`client_env` added to its environment). `command=None` means no relay: the
clients dial the emulator themselves (that is the direct baseline).

    run_peer(peer, sessions, duration, warmup=...) -> dict

runs one measured run and returns its figures (the keys of `summarize`).
A module named in `REFERENCE_PEERS` joins every `--real` run by exposing
`peer() -> Peer | str` (a str says why it cannot run on this machine, e.g.
not installed; it is printed and recorded, and the run goes on);
`module:function` names another such function of a module.
When reference peers ran, the run ends with `versus_references`: ours against
each as ratios (CPU and RSS per session, added p99 each way) and the most
real-time sessions each path held.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import importlib
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.client_protocols import GEMINI_MODEL
from bench.relay import REALTIME_MS, RESULTS, ROOT, _git, _machine, _ms, _Proc, _profile, _realtime, _triple
from bench.stats import Histogram, latencies
from live.cli import capacity

__all__ = [
    "DIRECT", "LIVE", "REFERENCE_PEERS", "Peer", "main", "run_peer", "summarize", "versus_references",
]

REFERENCE_PEERS = ("bench.floor_relay", "bench.floor_relay:websockets_peer", "bench.adk_peer")
SIZES = (10, 50, 100, 200)
QUICK_SIZES = (2, 10)
DURATION_S = 15.0
QUICK_DURATION_S = 3.0
WARMUP_S = 5.0  # two turns of every session, one of them interrupted
QUICK_WARMUP_S = 2.5


@dataclasses.dataclass(frozen=True)
class Peer:
    """What relays the load to the emulator: see the module docstring."""

    name: str
    command: Sequence[str] | None
    url: str
    client_protocol: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    client_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cwd: str | None = None
    start_timeout: float = 60.0


def _live_command() -> list[str]:
    """`live` as installed next to this Python (else the same entry point by module)."""
    script = Path(sys.executable).with_name("live")
    return [str(script)] if script.exists() else [sys.executable, "-m", "live.cli"]


DIRECT = Peer("direct", None, "{ws_url}", "gemini")
LIVE = Peer(
    "live",
    [
        *_live_command(),
        "serve",
        "--model", GEMINI_MODEL,
        "--port", "{port}",
        # Every simulated user comes from this machine, all at once.
        "--max-sessions", "{max_sessions}",
        "--max-sessions-per-ip", "{max_sessions}",
        "--max-pending", "{max_sessions}",
    ],
    "ws://127.0.0.1:{port}/live",
    "live",
)

# The same server on google-genai's own wire path: what the lean path saves (--sdk-wire).
LIVE_SDK_WIRE = dataclasses.replace(LIVE, name="live-sdk", env={"LIVE_GEMINI_WIRE": "sdk"})

ENDPOINT_PATH = "/ws/google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
# The run's one token opens every session of the run (`uses=0`), so it is
# minted once and must outlive the longest run (the server refuses a token
# valid for longer than its --max-token-lifetime, 1 h by default).
ENDPOINT_TOKEN_LIFETIME_S = 24 * 3600
# What `live serve` must accept to serve the endpoint as this run does.
ENDPOINT_FLAGS = ("--gemini-endpoint", "--certfile", "--keyfile", "--token-secret", "--max-token-lifetime")


@dataclasses.dataclass(frozen=True)
class EndpointCredentials:
    """What `live serve --gemini-endpoint` is served with for a run, and what its clients hold."""

    certfile: str
    keyfile: str
    ca_file: str
    secret: str
    token: str


@contextlib.contextmanager
def endpoint_credentials() -> Iterator[EndpointCredentials]:
    """A CA and a certificate for 127.0.0.1 made for the run, a token secret,
    and a token of it that opens any number of sessions; the files are removed afterwards."""
    import secrets

    import trustme

    from live.access.auth import mint_token

    folder = Path(tempfile.mkdtemp(prefix="bench-endpoint-"))
    try:
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        certfile, keyfile, ca_file = folder / "cert.pem", folder / "key.pem", folder / "ca.pem"
        for i, pem in enumerate(cert.cert_chain_pems):
            pem.write_to_path(str(certfile), append=i > 0)
        cert.private_key_pem.write_to_path(str(keyfile))
        ca.cert_pem.write_to_path(str(ca_file))
        secret = secrets.token_hex(32)
        token = mint_token(secret, ttl=ENDPOINT_TOKEN_LIFETIME_S, uses=0, subject="bench")
        yield EndpointCredentials(str(certfile), str(keyfile), str(ca_file), secret, token)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def endpoint_peer(base: Peer, credentials: EndpointCredentials) -> Peer:
    """`base` (a `live serve` peer) serving the Live API's endpoint over TLS,
    driven by the `gemini` adapter with the run's token as its key: `live` ->
    `live-endpoint`, `live@REF` -> `live-endpoint@REF`."""
    assert base.command is not None
    return dataclasses.replace(
        base,
        name="live-endpoint" + base.name.removeprefix("live"),
        command=[
            *base.command,
            "--gemini-endpoint",
            "--certfile", credentials.certfile,
            "--keyfile", credentials.keyfile,
            "--token-secret", credentials.secret,  # made for the run, on loopback: no secret of anyone's
            "--max-token-lifetime", str(ENDPOINT_TOKEN_LIFETIME_S),
        ],
        url="wss://127.0.0.1:{port}" + ENDPOINT_PATH,
        client_protocol="gemini",
        client_env={**base.client_env, "GOOGLE_API_KEY": credentials.token, "SSL_CERT_FILE": credentials.ca_file},
    )


# Whether a checkout's tokens can open more than one session (`uses`), asked of its own code
# (the token module was live/auth.py before it was live/access/auth.py).
_TOKEN_USES = """
import importlib, inspect
for name in ("live.access.auth", "live.auth"):
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError:
        continue
    print("uses" in inspect.signature(module.mint_token).parameters)
    break
"""


def endpoint_unsupported(base: Peer) -> str | None:
    """Why `base`'s code cannot serve the endpoint as `endpoint_peer` runs it, or None."""
    assert base.command is not None
    env = dict(os.environ, **base.env)
    cwd = base.cwd or ROOT
    try:
        shown = subprocess.run(
            [*base.command[: base.command.index("serve") + 1], "--help"],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
        )
        uses = subprocess.run([sys.executable, "-c", _TOKEN_USES], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot ask its `live serve` what it accepts: {exc}"
    if shown.returncode != 0:
        return f"`live serve --help` failed ({shown.returncode}): {shown.stderr.strip()[-300:]}"
    missing = [flag for flag in ENDPOINT_FLAGS if flag not in shown.stdout]
    if missing:
        return f"its `live serve` has no {', '.join(missing)}"
    if uses.returncode != 0 or uses.stdout.strip() not in ("True", "False"):
        return f"cannot read how its tokens are minted: {(uses.stderr or uses.stdout).strip()[-300:] or 'no mint_token'}"
    if uses.stdout.strip() == "False":
        return "its tokens open one session each (no `uses`), and every simulated user holds the same token"
    return None


# ---------------------------------------------------------------------------- processes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tree(pid: int) -> list[int]:
    """`pid` and every process descended from it (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(parents.get(current, ()))
    return found


def tree_usage(pid: int) -> tuple[float, int]:
    """CPU seconds (user + system) and resident bytes of `pid` and its descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu, rss = 0.0, 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            with open(f"/proc/{p}/status", encoding="ascii") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1]) * 1024
                        break
        except (OSError, IndexError, ValueError):
            continue  # it ended meanwhile
    return cpu, rss


class _Relay:
    """A peer's process: started, waited for until it accepts connections, stopped."""

    def __init__(self, peer: Peer, values: dict[str, Any], upstream_env: dict[str, str]) -> None:
        assert peer.command is not None
        self.peer = peer
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-{peer.name}-", suffix=".log", delete=False)
        env = dict(os.environ, **upstream_env)
        env.update({k: v.format(**values) for k, v in peer.env.items()})
        self.popen = subprocess.Popen(
            [part.format(**values) for part in peer.command],
            cwd=peer.cwd or ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stopping it stops its children too
        )
        self.port = values["port"]

    def wait_listening(self) -> None:
        deadline = time.monotonic() + self.peer.start_timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.peer.name} exited ({self.popen.returncode}): {self.tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"{self.peer.name} did not listen on {self.port}: {self.tail()}")

    def tail(self, size: int = 2000) -> str:
        try:
            return Path(self.log.name).read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


def run_peer(
    peer: Peer,
    sessions: int,
    duration: float,
    *,
    warmup: float = WARMUP_S,
    profile: Path | None = None,
) -> dict[str, Any]:
    """One measured run of `sessions` users through `peer` to a fresh emulator.

    With `profile`, py-spy (when installed) samples the peer's process for the
    measured window and writes collapsed stacks there.
    """
    emulator = _Proc(["bench.emulator_load"])
    relay: _Relay | None = None
    generator: _Proc | None = None
    spy: subprocess.Popen[bytes] | None = None
    try:
        up = emulator.read(60)
        upstream_env = {
            "GOOGLE_API_KEY": up["api_key"],
            "GOOGLE_GEMINI_BASE_URL": up["base_url"],
            "SSL_CERT_FILE": up["ca_file"],
        }
        values = {
            "port": _free_port(),
            "base_url": up["base_url"],
            "ws_url": up["ws_url"],
            "ca_file": up["ca_file"],
            "api_key": up["api_key"],
            "max_sessions": max(10, sessions),
            "python": sys.executable,
        }
        idle_rss = 0
        if peer.command is not None:
            relay = _Relay(peer, values, upstream_env)
            relay.wait_listening()
            time.sleep(0.5)  # settled: what it holds before the first session
            idle_rss = tree_usage(relay.popen.pid)[1]
        client_env = dict(upstream_env, **{k: v.format(**values) for k, v in peer.client_env.items()})
        generator = _Proc(
            [
                "bench.generator",
                peer.url.format(**values),
                str(sessions),
                str(duration),
                str(warmup),
                peer.client_protocol,
            ],
            env=client_env,
        )
        started = generator.read(90 + sessions * 0.1)  # {"event": "measuring"}
        assert started.get("event") == "measuring", started
        emulator.send("mark")
        cpu0 = tree_usage(relay.popen.pid)[0] if relay else 0.0
        machine0 = _machine()
        if profile is not None and relay is not None:
            spy = _profile(relay.popen.pid, duration, profile)
        client = generator.read(duration + 60)
        machine1 = _machine()
        cpu1, rss = tree_usage(relay.popen.pid) if relay else (0.0, 0)
        emulator.send("report")
        model = emulator.read(30)
        generator.stop()
        emulator.send("quit")
        emulator.stop()
        if spy is not None:
            spy.wait(30)
        result = summarize(
            peer.name,
            sessions,
            client,
            model,
            relay_cpu_s=cpu1 - cpu0 if relay else None,
            rss=rss if relay else None,
            idle_rss=idle_rss if relay else None,
        )
        window = result["window_s"]
        busy = machine1[0] - machine0[0]
        ours = (result["cpu_s"] or 0.0) + result["generator_cpu_s"] + result["emulator_cpu_s"]
        result["other_cpu_share"] = max(0.0, busy - ours) / window
        result["cpu_stall_share"] = (machine1[1] - machine0[1]) / window
        result["steal_share"] = (machine1[2] - machine0[2]) / window
        if relay is not None and result["failed"]:
            result["relay_log_tail"] = relay.tail()
        return result
    finally:
        for proc in (generator, emulator):
            if proc is not None and proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait(5)
        if spy is not None and spy.poll() is None:
            spy.kill()
            spy.wait(5)
        if relay is not None:
            relay.stop()


def summarize(
    name: str,
    sessions: int,
    client: dict[str, Any],
    model: dict[str, Any],
    *,
    relay_cpu_s: float | None,
    rss: int | None,
    idle_rss: int | None,
) -> dict[str, Any]:
    """The figures of one run, from the generator's and the emulator's reports."""
    timed = latencies(client, model)
    up, down, late, interrupt = timed.up, timed.down, timed.generator_late, timed.interrupt
    unmatched = timed.interrupts_unmatched
    window = model["window_s"]
    minutes = sessions * window / 60
    result: dict[str, Any] = {
        "mode": name,
        "sessions": sessions,
        "window_s": window,
        "up": up.summary(),
        "down": down.summary(),
        "interrupt": interrupt.summary(),
        "interrupts_sent": len(model["interrupts"]),
        "interrupts_unmatched": unmatched,
        "cpu_s": relay_cpu_s,
        "cpu_s_per_session_minute": None if relay_cpu_s is None else relay_cpu_s / minutes,
        "cpu_share_of_one_core": None if relay_cpu_s is None else relay_cpu_s / window,
        "rss_bytes": rss,
        "idle_rss_bytes": idle_rss,
        "rss_per_session_bytes": None if rss is None or idle_rss is None else (rss - idle_rss) / sessions,
        "up_frames_sent": client["up_sent"],
        "up_frames_received": model["up_frames"],
        "up_dropped": model["up_gaps"],
        "down_chunks_sent": model["down_chunks"],
        "down_chunks_received": client["down_chunks"],
        "down_dropped": client["down_gaps"],
        "dropped": model["up_gaps"] + client["down_gaps"],
        "turns": client["turns"],
        "errors": client["errors"],
        "connected": client["connected"],
        "alive": client["alive"],
        "failed": client["failed"],
        "upstream_sessions_open": model["sessions"],
        "upstream_closes": model["closes"],
        "generator_late": late.summary(),
        "generator_cpu_s": client["generator_cpu_s"],
        "emulator_late": Histogram.from_json(model["late"]).summary(),
        "emulator_cpu_s": model["cpu_s"],
    }
    result["realtime"], result["why_not_realtime"] = _realtime(result)
    emulator_late = result["emulator_late"]["max_ms"]
    if emulator_late is not None and emulator_late > REALTIME_MS:
        # The upstream itself fell behind: the machine, not the relay, is the limit.
        result["realtime"] = False
        result["why_not_realtime"].append(f"emulator {emulator_late:.0f} ms behind")
    if result["upstream_sessions_open"] < sessions or result["upstream_closes"]:
        result["realtime"] = False
        result["why_not_realtime"].append(
            f"upstream: {result['upstream_sessions_open']} of {sessions} session(s) open, "
            f"closed by the emulator: {result['upstream_closes'] or 'none'}"
        )
    return result


def added(run: dict[str, Any], direct: dict[str, Any]) -> dict[str, Any]:
    """A peer's latency minus the direct baseline's, per direction and for interruptions."""
    out: dict[str, Any] = {}
    for key in ("up", "down", "interrupt"):
        out[key] = {
            stat: None if run[key][stat] is None or direct[key][stat] is None else run[key][stat] - direct[key][stat]
            for stat in ("p50_ms", "p99_ms", "max_ms")
        }
    return out


# ---------------------------------------------------------------------------- the run


def reference_peers() -> tuple[list[Peer], dict[str, str]]:
    """The reference peers that can run here, and why the others cannot."""
    found: list[Peer] = []
    skipped: dict[str, str] = {}
    for entry in REFERENCE_PEERS:
        module_name, _, function = entry.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # not part of this checkout
            skipped[entry] = f"{type(exc).__name__}: {exc}"
            continue
        got = getattr(module, function or "peer")()
        if isinstance(got, Peer):
            found.append(got)
        else:
            skipped[entry] = str(got)
    return found, skipped


def _detail(r: dict[str, Any]) -> str:
    cpu = (
        f"CPU {r['cpu_share_of_one_core'] * 100:.0f}% of a core, RSS {r['rss_bytes'] / 2**20:.1f} MiB  "
        if r["cpu_s"] is not None
        else ""
    )
    return (
        f"  {r['mode']:8} N={r['sessions']:<4} up {_triple(r['up'])} ms  down {_triple(r['down'])} ms  "
        f"interrupt {_triple(r['interrupt'])} ms (n={r['interrupt']['n']})  {cpu}"
        f"emulator {r['emulator_cpu_s'] / r['window_s'] * 100:.0f}% "
        f"(late max {_ms(r['emulator_late']['max_ms'])} ms), "
        f"generator {r['generator_cpu_s'] / r['window_s'] * 100:.0f}% "
        f"(late max {_ms(r['generator_late']['max_ms'])} ms)  "
        f"other load {r['other_cpu_share'] * 100:.0f}%, steal {r['steal_share'] * 100:.0f}%  "
        f"errors {r['errors'] or '-'}" + (f"  failed {r['failed'][:2]}" if r["failed"] else "")
    )


def _signed(d: dict[str, float | None]) -> str:
    return " / ".join("-" if d[k] is None else f"{d[k]:+.2f}" for k in ("p50_ms", "p99_ms", "max_ms"))


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| sessions | path | real time | up ms p50/p99/max | down ms p50/p99/max "
        "| interrupt ms p50/p99/max | CPU % of a core | CPU s per session-min | RSS KiB per session |",
        "|" + "---|" * 9,
    ]
    for row in rows:
        for name, r in row["runs"].items():
            if name in row["added"]:
                a = row["added"][name]
                up, down, intr = (_signed(a[k]) for k in ("up", "down", "interrupt"))
            else:
                up, down, intr = (_triple(r[k]) for k in ("up", "down", "interrupt"))
            rt = "yes" if r["realtime"] else "no: " + ", ".join(r["why_not_realtime"])
            if r["cpu_s"] is None:
                cpu = share = rss = "-"
            else:
                share = f"{r['cpu_share_of_one_core'] * 100:.0f}"
                cpu = f"{r['cpu_s_per_session_minute']:.3f}"
                rss = f"{r['rss_per_session_bytes'] / 1024:.0f}"
            lines.append(
                f"| {row['sessions']} | {name} | {rt} | {up} | {down} | {intr} | {share} | {cpu} | {rss} |"
            )
    return "\n".join(lines)


def versus_references(rows: list[dict[str, Any]], references: Sequence[str]) -> list[str]:
    """Ours against each reference peer of the same run, as ratios: the issue's
    comparison printed, not remembered. Also the most sessions each path held in
    real time among the sizes run."""
    lines = []
    for row in rows:
        ours = row["runs"].get(LIVE.name)
        for name in references:
            ref = row["runs"].get(name)
            if ours is None or ref is None:
                continue
            parts = []
            for key, label, fmt in (
                ("cpu_s_per_session_minute", "CPU s per session-minute", "{:.3f}"),
                ("rss_per_session_bytes", "RSS KiB per session", "{:.0f}"),
            ):
                a, b = ours.get(key), ref.get(key)
                if a is not None and b:
                    scale = 1 / 1024 if key.startswith("rss") else 1.0
                    parts.append(
                        f"{label} {fmt.format(a * scale)} vs {fmt.format(b * scale)} ({a / b:.2f}x)"
                    )
            added = row["added"]
            if LIVE.name in added and name in added:
                for direction in ("up", "down"):
                    a, b = added[LIVE.name][direction]["p99_ms"], added[name][direction]["p99_ms"]
                    if a is not None and b is not None:
                        parts.append(f"added p99 {direction} {a:.2f} vs {b:.2f} ms")
            # A path that falls behind does less work in the window: its ratios flatter it.
            behind = [n for n, r in ((LIVE.name, ours), (name, ref)) if not r["realtime"]]
            note = f" ({' and '.join(behind)} not real time)" if behind else ""
            lines.append(f"N={row['sessions']}{note}: {LIVE.name} vs {name}: " + ", ".join(parts))
    for name in (LIVE.name, *references):
        held = [row["sessions"] for row in rows if row["runs"].get(name, {}).get("realtime")]
        lines.append(f"most real-time sessions, {name}: {max(held) if held else 'none'} (of N = "
                     f"{', '.join(str(row['sessions']) for row in rows)})")
    return lines


def spread(rows: list[dict[str, Any]]) -> list[str]:
    """Per N and path, over the repeated runs: the median CPU per session-minute and
    added p99 each way, with their range (what one run alone cannot say)."""
    by_size: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_size.setdefault(row["sessions"], []).append(row)
    lines = []
    for n, same in by_size.items():
        names = [name for name in same[0]["runs"] if name != DIRECT.name]
        for name in names:
            figures = []
            cpu = [r["runs"][name]["cpu_s_per_session_minute"] for r in same if name in r["runs"]]
            figures.append(_median_range("CPU s per session-min", [c for c in cpu if c is not None], "{:.3f}"))
            for direction in ("up", "down"):
                p99 = [r["added"][name][direction]["p99_ms"] for r in same if name in r.get("added", {})]
                figures.append(_median_range(f"added p99 {direction} ms", [p for p in p99 if p is not None], "{:+.2f}"))
            held = sum(1 for r in same if r["runs"].get(name, {}).get("realtime"))
            lines.append(f"N={n} {name} over {len(same)} runs: {', '.join(figures)}; real time in {held}")
    return lines


def capacity_rule(rows: list[dict[str, Any]], probes: list[float]) -> dict[str, Any]:
    """The figures behind `--max-sessions auto` (`live.cli.capacity`), as this run measured them:
    the probe's median over the run, and `live`'s CPU per session-minute at the N
    closest to 50."""
    probe = statistics.median(probes) if probes else None
    costs = {
        row["sessions"]: row["runs"][LIVE.name]["cpu_s_per_session_minute"]
        for row in rows
        if LIVE.name in row["runs"] and row["runs"][LIVE.name].get("realtime")
    }
    if probe is None or not costs:
        return {"probe_us": probe, "cost": None, "said": "capacity rule: no real-time run of live to rest it on"}
    n = min(costs, key=lambda size: abs(size - 50))
    cost = statistics.median(
        row["runs"][LIVE.name]["cpu_s_per_session_minute"]
        for row in rows
        if row["sessions"] == n and LIVE.name in row["runs"]
    )
    estimate = capacity.estimate(probe)
    return {
        "probe_us": probe,
        "cost": cost,
        "at_sessions": n,
        "said": (
            f"capacity rule: probe {probe:.1f} us (median of {len(probes)}; live.cli.capacity.REFERENCE_PROBE_US "
            f"is {capacity.REFERENCE_PROBE_US:g}), live {cost:.3f} CPU s per session-minute at N={n} "
            f"(REFERENCE_COST {capacity.REFERENCE_COST:g}); --max-sessions auto gives {estimate.sessions} here, "
            f"this run's figures would give {math.floor(capacity.CORE_SHARE * 60 / cost)}"
        ),
    }


def _median_range(label: str, values: list[float], fmt: str) -> str:
    if not values:
        return f"{label} -"
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return f"{label} {fmt.format(median)} ({fmt.format(ordered[0])} to {fmt.format(ordered[-1])})"


def main(
    sizes: Sequence[int] | None = None,
    duration: float | None = None,
    warmup: float | None = None,
    *,
    quick: bool = False,
    json_path: str | None = None,
    sdk_wire: bool = False,
    profile: bool = False,
    baseline: str | Sequence[str] | None = None,
    repeat: int = 1,
    workers: int = 1,
    gemini_endpoint: bool = False,
) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            # Stopped from outside (timeout, CI): the relays, the emulator and any
            # baseline checkout are cleaned up as on Ctrl-C; the handler goes
            # with the run (a caller's process gets its own back).
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
            stack.callback(signal.signal, signal.SIGTERM, signal.SIG_DFL)
        extra = [LIVE_SDK_WIRE] if sdk_wire else []
        credentials = stack.enter_context(endpoint_credentials()) if gemini_endpoint else None
        if credentials is not None:
            extra.append(endpoint_peer(LIVE, credentials))
        unable: dict[str, str] = {}
        for ref in [baseline] if isinstance(baseline, str) else baseline or ():
            base = stack.enter_context(baseline_peer(ref))
            extra.append(base)
            if credentials is not None:
                peer = endpoint_peer(base, credentials)
                why = endpoint_unsupported(base)
                if why is None:
                    extra.append(peer)
                else:
                    unable[peer.name] = why
        return _main(sizes, duration, warmup, quick, json_path, extra, profile, repeat, workers, unable)


@contextlib.contextmanager
def baseline_peer(ref: str) -> Iterator[Peer]:
    """`live serve` as of git `ref`, from a temporary worktree removed afterwards.

    It runs on this environment's packages with the worktree first on the
    path, so what differs is the project's code alone.
    """
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "--verify", f"{ref}^{{commit}}"],
        cwd=ROOT, capture_output=True, text=True,
    )
    if commit.returncode != 0:
        raise SystemExit(f"--baseline: {ref!r} is not a commit here: {commit.stderr.strip()}")
    short = commit.stdout.strip()
    tree = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    try:
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--quiet", str(tree), short], cwd=ROOT, check=True
        )
        path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
        yield dataclasses.replace(LIVE, name=f"live@{short}", env={"PYTHONPATH": path}, cwd=str(tree))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        shutil.rmtree(tree, ignore_errors=True)  # also when `worktree add` failed half way
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)


def _main(
    sizes: Sequence[int] | None,
    duration: float | None,
    warmup: float | None,
    quick: bool,
    json_path: str | None,
    extra: list[Peer],
    profile: bool,
    repeat: int = 1,
    workers: int = 1,
    unable: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    # Repeats are interleaved (every N once, then again), so a slow spell of
    # the machine touches every peer and size alike.
    sizes = list(sizes or (QUICK_SIZES if quick else SIZES)) * max(1, repeat)
    duration = duration or (QUICK_DURATION_S if quick else DURATION_S)
    warmup = warmup if warmup is not None else (QUICK_WARMUP_S if quick else WARMUP_S)
    peers, skipped = reference_peers()
    skipped = {**(unable or {}), **skipped}
    ours = [LIVE, *extra]
    if workers > 1:  # every `live serve` of the run, as `live serve --workers N`
        ours = [dataclasses.replace(p, command=[*p.command, "--workers", str(workers)]) for p in ours]
    order = [DIRECT, *ours, *peers]
    print(
        f"real-path benchmark: N = {sizes}, {duration:g} s each after {warmup:g} s of warm-up; "
        f"{', '.join(p.name for p in order)}; `live serve` in {workers} process(es); "
        f"{os.cpu_count()} CPU(s)",
        flush=True,
    )
    for module_name, why in skipped.items():
        what = "peer" if unable and module_name in unable else "reference peer"
        print(f"  {what} {module_name} cannot run here: {why}", flush=True)
    stamp = f"{dt.datetime.now():%Y%m%d-%H%M%S}"
    rows = []
    probes: list[float] = []
    for n in sizes:
        runs: dict[str, Any] = {}
        for peer in order:
            spied = (
                RESULTS / f"profile-real-{peer.name}-{n}-{stamp}.txt"
                if profile and n == max(sizes) and peer.command is not None
                else None
            )
            probes.append(capacity.probe_us())  # this machine's speed now, for --max-sessions auto
            try:
                runs[peer.name] = run_peer(peer, n, duration, warmup=warmup, profile=spied)
            except (RuntimeError, TimeoutError, AssertionError) as exc:
                print(f"  {peer.name:8} N={n:<4} failed: {exc}", flush=True)
                runs[peer.name] = None
                continue
            print(_detail(runs[peer.name]), flush=True)
        done = {k: v for k, v in runs.items() if v is not None}
        direct = done.get(DIRECT.name)
        rows.append(
            {
                "sessions": n,
                "runs": done,
                "failed": [k for k, v in runs.items() if v is None],
                "added": {k: added(v, direct) for k, v in done.items() if direct and k != DIRECT.name},
            }
        )
    report = {
        "benchmark": "relay-real",
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "git": _git(),
        "model": GEMINI_MODEL,
        "duration_s": duration,
        "warmup_s": warmup,
        "workers": workers,
        "peers": [p.name for p in order],
        "peers_skipped": skipped,
        "rows": rows,
    }
    print()
    print(table(rows))
    print()
    print("(direct: absolute; every other path: added to direct's, so a negative figure is noise)")
    references = [p.name for p in peers]
    if references:
        report["versus_references"] = versus_references(rows, references)
        print()
        print("\n".join(report["versus_references"]))
    if repeat > 1:
        report["spread"] = spread(rows)
        print()
        print("\n".join(report["spread"]))
    report["capacity"] = capacity_rule(rows, probes)
    print()
    print(report["capacity"]["said"])
    path = Path(json_path) if json_path else RESULTS / f"relay-real-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")
    return report
