"""What the session server costs a conversation, and how many conversations one machine holds.

    python -m bench.relay                       # N = 1, 50, 200; 15 s each
    python -m bench.relay --search              # ... and the largest real-time N
    python -m bench.relay --sessions 1,100 --duration 30 --json out.json
    python -m bench.relay --quick               # N = 1, 20; 4 s each
    python -m bench.relay --browser-deflate     # clients offer deflate, as browsers do
    python -m bench.relay --profile             # py-spy the server at the largest N
    python -m bench.relay --observability       # metrics off / on / on + --record, side by side
    python -m bench.relay --real                # the real Gemini path: see bench/real.py

For every N, two runs of the same load, one after the other (never together:
the machine has two cores):

- **relay**: N `LiveClient`s (process 1) -> `LiveServer` -> `Gemini(transport=
  DoubleTransport(...))` (process 2, the double inside it: it is the upstream);
- **baseline**: the same clients -> a bare WebSocket bridge -> the same double
  (process 2 of the same shape, without our server).

Every 20 ms microphone frame carries its send time and every 40 ms reply chunk
the time the model was due to send it, so latency is measured per frame, end to
end, in each direction; `interrupted` at the model is timed to `turn.interrupted`
at the client. "Added" figures are relay minus baseline. CPU and RSS are the
model-side process's own (the double's share is in both; the difference is
ours). A run is real time when no frame, chunk or interruption took more than
100 ms, nothing was dropped, every session stayed up and the generator itself
kept its schedule within 100 ms.

Both model-side processes tune the garbage collector as `live serve` does
(BENCH_DEFAULT_GC=1 in the environment keeps CPython's defaults). The double
hands typed messages over; the real Gemini path also pays the SDK's own work
per message (JSON, base64, pydantic), measured separately at the end of a run.

With --real, the same measurements on the real Gemini path instead: `live
serve` as a user runs it (google-genai, TLS) against the Live emulator in its
own process, beside the same load straight to the emulator, and any reference
relay installed (bench/real.py says how, and how to add one).

Writes the whole run as JSON to bench/results/relay-<timestamp>.json (or --json;
relay-real-<timestamp>.json with --real).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.stats import Histogram, latencies

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
REALTIME_MS = 100.0
WARMUP_S = 6.0  # a whole conversation cycle: every code path has run once (first uses are slow)


# ---------------------------------------------------------------------------- processes


class _Proc:
    """A child process spoken to in JSON lines, every read bounded in time."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        env = dict(os.environ, **(env or {}), PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=False,
        )
        self._buffer = b""

    def read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.popen.args[2:]} said nothing for {timeout:g} s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"{self.popen.args[2:]} exited ({self.popen.wait()})")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def send(self, command: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(command.encode() + b"\n")
        self.popen.stdin.flush()

    def stop(self, timeout: float = 15.0) -> None:
        if self.popen.poll() is None:
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def _machine() -> tuple[float, float, float]:
    """CPU seconds the machine used (steal excluded), seconds some task waited for a
    CPU, and seconds the hypervisor took from this machine (steal)."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    steal = fields[7] / tick if len(fields) > 7 else 0.0
    busy = sum(fields[:7]) - fields[3] - fields[4]  # all but idle, iowait and steal
    stalled = 0.0
    try:
        with open("/proc/pressure/cpu", encoding="ascii") as pressure:
            stalled = int(pressure.readline().rsplit("total=", 1)[1]) / 1e6
    except (OSError, IndexError, ValueError):
        pass
    return busy / tick, stalled, steal


def run_once(
    mode: str,
    sessions: int,
    duration: float,
    profile: Path | None = None,
    warmup: float = WARMUP_S,
    deflate: bool = False,
    workers: int = 1,
) -> dict[str, Any]:
    """One measured run: endpoint process(es) sharing one port, and a generator."""
    endpoints = [_Proc(["bench.endpoint", mode, "0", str(workers)])]
    generator: _Proc | None = None
    spy: subprocess.Popen[bytes] | None = None
    try:
        hello = endpoints[0].read(30)
        for _ in range(workers - 1):
            endpoints.append(_Proc(["bench.endpoint", mode, str(hello["port"]), str(workers)]))
            endpoints[-1].read(30)
        url = f"ws://127.0.0.1:{hello['port']}/live"
        generator = _Proc(
            ["bench.generator", url, str(sessions), str(duration), str(warmup)]
            + (["deflate"] if deflate else [])
        )
        generator.read(60 + sessions * 0.05)  # {"event": "measuring"}
        for endpoint in endpoints:
            endpoint.send("mark")
        busy0, stalled0, steal0 = _machine()
        if profile is not None:
            spy = _profile(endpoints[0].popen.pid, duration, profile)
        client = generator.read(duration + 60)
        busy1, stalled1, steal1 = _machine()
        for endpoint in endpoints:
            endpoint.send("report")
        model = _merge_reports([endpoint.read(30) for endpoint in endpoints])
        generator.stop()
        for endpoint in endpoints:
            endpoint.send("quit")
            endpoint.stop()
        if spy is not None:
            spy.wait(30)
        result = _summarize(mode, sessions, client, model)
        result["workers"] = workers
        window = result["window_s"]
        ours = result["cpu_s"] + result["generator_cpu_s"]
        result["other_cpu_share"] = max(0.0, (busy1 - busy0) - ours) / window
        result["cpu_stall_share"] = (stalled1 - stalled0) / window
        result["steal_share"] = (steal1 - steal0) / window
        return result
    finally:
        for proc in (generator, *endpoints):
            if proc is not None and proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait(5)


def _merge_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report for several endpoint processes: sums, merged histograms, maxima."""
    if len(reports) == 1:
        return reports[0]
    merged = dict(reports[0])
    merged["window_s"] = max(r["window_s"] for r in reports)
    for key in ("cpu_s", "idle_rss", "rss", "sessions", "up_frames", "up_gaps", "down_chunks"):
        merged[key] = sum(r[key] for r in reports)
    merged["interrupts"] = [i for r in reports for i in r["interrupts"]]
    merged["loop_lag_spikes"] = [x for r in reports for x in r["loop_lag_spikes"]]
    for key in ("up_latency", "loop_lag"):
        histogram = Histogram.from_json(reports[0][key])
        for r in reports[1:]:
            histogram.merge(Histogram.from_json(r[key]))
        merged[key] = histogram.to_json()
    per_generation = [r["gc"] for r in reports]  # lists indexed by GC generation
    merged["gc"] = {
        "total_s": [sum(g) for g in zip(*(x["total_s"] for x in per_generation), strict=True)],
        "max_s": [max(g) for g in zip(*(x["max_s"] for x in per_generation), strict=True)],
        "count": [sum(g) for g in zip(*(x["count"] for x in per_generation), strict=True)],
    }
    return merged


def _profile(pid: int, duration: float, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy (when installed) on the model-side process for the measured window."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        print("  (py-spy is not installed next to this Python: no profile)", flush=True)
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [str(spy), "record", "--pid", str(pid), "--duration", str(max(1, int(duration) - 1)),
         "--rate", "200", "--format", "raw", "--output", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _summarize(mode: str, sessions: int, client: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    timed = latencies(client, model)
    up, down, late, interrupt = timed.up, timed.down, timed.generator_late, timed.interrupt
    unmatched = timed.interrupts_unmatched
    session_minutes = sessions * model["window_s"] / 60
    dropped = model["up_gaps"] + client["down_gaps"]
    result = {
        "mode": mode,
        "sessions": sessions,
        "window_s": model["window_s"],
        "up": up.summary(),
        "down": down.summary(),
        "interrupt": interrupt.summary(),
        "interrupts_unmatched": unmatched,
        "cpu_s": model["cpu_s"],
        "cpu_s_per_session_minute": model["cpu_s"] / session_minutes,
        "cpu_share_of_one_core": model["cpu_s"] / model["window_s"],
        "rss_bytes": model["rss"],
        "idle_rss_bytes": model["idle_rss"],
        "rss_per_session_bytes": (model["rss"] - model["idle_rss"]) / sessions,
        "up_frames_sent": client["up_sent"],
        "up_frames_received": model["up_frames"],
        "up_dropped": model["up_gaps"],
        "down_chunks_sent": model["down_chunks"],
        "down_chunks_received": client["down_chunks"],
        "down_dropped": client["down_gaps"],
        "dropped": dropped,
        "turns": client["turns"],
        "errors": client["errors"],
        "connected": client["connected"],
        "alive": client["alive"],
        "failed": client["failed"],
        "model_sessions_open": model["sessions"],
        "generator_late": late.summary(),
        "generator_cpu_s": client["generator_cpu_s"],
        "gc": model.get("gc"),
        "loop_lag": Histogram.from_json(model["loop_lag"]).summary(),
        "loop_lag_spikes": model["loop_lag_spikes"],
    }
    result["realtime"], result["why_not_realtime"] = _realtime(result)
    return result


def _realtime(r: dict[str, Any]) -> tuple[bool, list[str]]:
    why = []
    for key in ("up", "down", "interrupt"):
        worst = r[key]["max_ms"]
        if worst is not None and worst > REALTIME_MS:
            why.append(f"{key} max {worst:.0f} ms")
    if r["up"]["n"] == 0 or r["down"]["n"] == 0:
        why.append("no audio measured")
    if r["dropped"]:
        why.append(f"{r['dropped']} frame(s) dropped")
    if r["alive"] < r["sessions"]:
        why.append(f"{r['sessions'] - r['alive']} session(s) ended")
    late = r["generator_late"]["max_ms"]
    if late is not None and late > REALTIME_MS:
        why.append(f"generator {late:.0f} ms behind")
    return not why, why


# ---------------------------------------------------------------------------- comparing


def _added(relay: dict[str, Any], base: dict[str, Any], key: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for stat in ("p50_ms", "p99_ms", "max_ms"):
        a, b = relay[key][stat], base[key][stat]
        out[stat] = None if a is None or b is None else a - b
    return out


def compare(relay: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"sessions": relay["sessions"], "realtime": relay["realtime"]}
    if base is not None:
        for key in ("up", "down", "interrupt"):
            row[f"{key}_added_ms"] = _added(relay, base, key)
        row["cpu_added_s_per_session_minute"] = (
            relay["cpu_s_per_session_minute"] - base["cpu_s_per_session_minute"]
        )
        row["cpu_ratio"] = relay["cpu_s_per_session_minute"] / max(
            base["cpu_s_per_session_minute"], 1e-9
        )
        row["rss_added_per_session_bytes"] = (
            relay["rss_per_session_bytes"] - base["rss_per_session_bytes"]
        )
        p99 = base["down"]["p99_ms"], base["up"]["p99_ms"]
        row["latency_p99_ratio"] = {
            "up": relay["up"]["p99_ms"] / p99[1] if p99[1] else None,
            "down": relay["down"]["p99_ms"] / p99[0] if p99[0] else None,
        }
    return row


def sdk_path_cost() -> dict[str, float] | None:
    """Per-message CPU the real Gemini path adds that the double skips.

    The SDK turns every 20 ms frame into validated models, a dict and base64
    JSON before it reaches the socket, and parses every server message (JSON,
    base64, pydantic) before `receive()` yields it; the double hands typed
    messages over directly. Measured here with the SDK's own functions.
    """
    try:
        import base64
        import timeit

        from google.genai import _common, types
        from google.genai import _live_converters as live_converters

        pcm_up, pcm_down = bytes(640), bytes(1920)

        def send() -> str:
            params = types.LiveSendRealtimeInputParameters.model_validate(
                {"audio": types.Blob(data=pcm_up, mime_type="audio/pcm;rate=16000")}
            )
            as_dict = live_converters._LiveSendRealtimeInputParameters_to_mldev(from_object=params)
            as_dict = _common.encode_unserializable_types(_common.convert_to_dict(as_dict))
            return json.dumps({"realtime_input": as_dict})

        raw = json.dumps(
            {
                "serverContent": {
                    "modelTurn": {
                        "parts": [
                            {
                                "inlineData": {
                                    "mimeType": "audio/pcm;rate=24000",
                                    "data": base64.b64encode(pcm_down).decode(),
                                }
                            }
                        ]
                    }
                }
            }
        )
        empty = types.LiveServerMessage().model_dump()

        def receive() -> types.LiveServerMessage:
            response = live_converters._LiveServerMessage_from_mldev(json.loads(raw))
            return types.LiveServerMessage._from_response(response=response, kwargs=empty)

        assert receive().server_content.model_turn.parts[0].inline_data.data == pcm_down
        n = 3000
        return {
            "send_us_per_frame": min(timeit.repeat(send, number=n, repeat=3)) / n * 1e6,
            "receive_us_per_chunk": min(timeit.repeat(receive, number=n, repeat=3)) / n * 1e6,
        }
    except Exception:  # noqa: BLE001 - private SDK functions may move; the figure is optional
        return None


# ---------------------------------------------------------------------------- output


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _triple(d: dict[str, float | None]) -> str:
    return f"{_ms(d['p50_ms'])} / {_ms(d['p99_ms'])} / {_ms(d['max_ms'])}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| sessions | real time | up added ms p50/p99/max | down added ms p50/p99/max "
        "| interrupt added ms p50/p99/max | CPU s per session-min relay (baseline) "
        "| RSS KiB per session relay (baseline) | dropped |"
    )
    lines = [head, "|" + "---|" * 8]
    for row in rows:
        relay, base = row["relay"], row.get("baseline")
        cmp_ = row["compare"]
        if base is not None:
            up, down, intr = (
                _triple(cmp_["up_added_ms"]),
                _triple(cmp_["down_added_ms"]),
                _triple(cmp_["interrupt_added_ms"]),
            )
            cpu = f"{relay['cpu_s_per_session_minute']:.3f} ({base['cpu_s_per_session_minute']:.3f})"
            rss = (
                f"{relay['rss_per_session_bytes'] / 1024:.0f} "
                f"({base['rss_per_session_bytes'] / 1024:.0f})"
            )
        else:
            up, down, intr = (
                "abs " + _triple(relay["up"]),
                "abs " + _triple(relay["down"]),
                "abs " + _triple(relay["interrupt"]),
            )
            cpu = f"{relay['cpu_s_per_session_minute']:.3f}"
            rss = f"{relay['rss_per_session_bytes'] / 1024:.0f}"
        rt = "yes" if relay["realtime"] else "no: " + ", ".join(relay["why_not_realtime"])
        lines.append(
            f"| {relay['sessions']} | {rt} | {up} | {down} | {intr} | {cpu} | {rss} "
            f"| {relay['dropped']} |"
        )
    return "\n".join(lines)


def _detail(result: dict[str, Any]) -> str:
    return (
        f"  {result['mode']:8} N={result['sessions']:<4} "
        f"up {_triple(result['up'])} ms  down {_triple(result['down'])} ms  "
        f"interrupt {_triple(result['interrupt'])} ms (n={result['interrupt']['n']})  "
        f"CPU {result['cpu_share_of_one_core'] * 100:.0f}% of a core  "
        f"RSS {result['rss_bytes'] / 2**20:.1f} MiB  "
        f"generator late max {_ms(result['generator_late']['max_ms'])} ms, "
        f"CPU {result['generator_cpu_s'] / result['window_s'] * 100:.0f}%  "
        f"errors {result['errors'] or '-'}  "
        f"loop lag p99/max {_ms(result['loop_lag']['p99_ms'])}/{_ms(result['loop_lag']['max_ms'])} ms  "
        f"other load {result['other_cpu_share'] * 100:.0f}% of a core, "
        f"CPU stall {result['cpu_stall_share'] * 100:.0f}%, "
        f"steal {result['steal_share'] * 100:.0f}% of a core"
    )


def _git() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", "live", "connections", "bench"))}


# ---------------------------------------------------------------------------- the run


def measure(
    sessions: int,
    duration: float,
    *,
    baseline: bool = True,
    profile: Path | None = None,
    warmup: float = WARMUP_S,
    deflate: bool = False,
    workers: int = 1,
) -> dict[str, Any]:
    row: dict[str, Any] = {"sessions": sessions}
    if baseline:
        row["baseline"] = run_once(
            "baseline", sessions, duration, warmup=warmup, deflate=deflate, workers=workers
        )
        print(_detail(row["baseline"]), flush=True)
    row["relay"] = run_once("relay", sessions, duration, profile, warmup, deflate, workers)
    print(_detail(row["relay"]), flush=True)
    row["compare"] = compare(row["relay"], row.get("baseline"))
    return row


def search(
    start: int,
    duration: float,
    *,
    warmup: float = WARMUP_S,
    deflate: bool = False,
    workers: int = 1,
    limit: int = 2000,
    steps: int = 9,
) -> tuple[int, list[dict[str, Any]]]:
    """The largest N that stays real time: grow by 1.5x, then halve the gap (bounded)."""
    tried: list[dict[str, Any]] = []
    good, bad = 0, None
    n = max(start, 1)
    for _ in range(steps):
        row = measure(n, duration, baseline=False, warmup=warmup, deflate=deflate, workers=workers)
        tried.append(row)
        if row["relay"]["realtime"]:
            good = n
        else:
            bad = n
        if bad is None:
            n = min(limit, int(n * 1.5))
            if n == good:
                break
        else:
            if bad - good <= max(5, good // 20):
                break
            n = (good + bad) // 2
    return good, tried


OBSERVABILITY_MODES = (
    ("relay-bare", "off"),
    ("relay", "metrics"),
    ("relay-record", "metrics + record"),
)


def observability(
    sizes: list[int], duration: float, warmup: float, workers: int, json_path: str | None, stamp: str
) -> dict[str, Any]:
    """What metrics and recording cost per session: the same load, three ways, one after another."""
    rows = []
    for n in sizes:
        row: dict[str, Any] = {"sessions": n}
        for mode, _ in OBSERVABILITY_MODES:
            row[mode] = run_once(mode, n, duration, warmup=warmup, workers=workers)
            print(_detail(row[mode]), flush=True)
        rows.append(row)
    lines = [
        "| sessions | metrics / record | real time | CPU s per session-min | CPU added vs off "
        "| RSS KiB per session | up ms p50/p99 | down ms p50/p99 |",
        "|" + "---|" * 8,
    ]
    for row in rows:
        off = row["relay-bare"]["cpu_s_per_session_minute"]
        for mode, label in OBSERVABILITY_MODES:
            r = row[mode]
            cpu = r["cpu_s_per_session_minute"]
            added = "" if mode == "relay-bare" else f"{cpu - off:+.3f} ({(cpu - off) / off * 100:+.0f}%)"
            rt = "yes" if r["realtime"] else "no: " + ", ".join(r["why_not_realtime"])
            lines.append(
                f"| {row['sessions']} | {label} | {rt} | {cpu:.3f} | {added} "
                f"| {r['rss_per_session_bytes'] / 1024:.0f} "
                f"| {_ms(r['up']['p50_ms'])} / {_ms(r['up']['p99_ms'])} "
                f"| {_ms(r['down']['p50_ms'])} / {_ms(r['down']['p99_ms'])} |"
            )
    print()
    print("\n".join(lines))
    report = {
        "benchmark": "relay-observability",
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "git": _git(),
        "duration_s": duration,
        "workers": workers,
        "rows": rows,
    }
    path = Path(json_path) if json_path else RESULTS / f"relay-observability-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.relay", description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", default=None, help="comma-separated N (default 1,50,200)")
    parser.add_argument("--duration", type=float, default=None, help="measured seconds per run (15)")
    parser.add_argument("--search", action="store_true", help="also find the largest real-time N")
    parser.add_argument("--search-duration", type=float, default=10.0, help="seconds per search step")
    parser.add_argument("--json", default=None, help="where to write the run (default bench/results/)")
    parser.add_argument("--quick", action="store_true", help="N = 1, 20 for 4 s each")
    parser.add_argument(
        "--browser-deflate",
        action="store_true",
        help="clients offer permessage-deflate when connecting, as browsers do",
    )
    parser.add_argument(
        "--warmup", type=float, default=WARMUP_S, help="seconds of load before measuring (6)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes sharing the port, as `live serve --workers` (1); with --real, every `live serve` of the run",
    )
    parser.add_argument(
        "--observability",
        action="store_true",
        help="instead of the baseline, run the relay with metrics off, on (as shipped), and "
        "on with every session recorded, side by side",
    )
    parser.add_argument(
        "--real",
        action="store_true",
        help="the real Gemini path: `live serve` (google-genai, TLS) against the Live emulator "
        "out of process, beside the same load straight to the emulator (see bench/real.py); "
        "N = 10,50,100,200 (--quick: 2,10)",
    )
    parser.add_argument(
        "--sdk-wire",
        action="store_true",
        help="with --real, also run `live serve` on the SDK's own wire path (LIVE_GEMINI_WIRE=sdk), "
        "beside the lean one, in the same run",
    )
    parser.add_argument(
        "--gemini-endpoint",
        action="store_true",
        help="with --real, also run `live serve --gemini-endpoint` (TLS, a token as the clients' key) "
        "with the load spoken to it in the Live API's own protocol, beside /live; with --baseline, "
        "the endpoint as of REF too",
    )
    parser.add_argument(
        "--baseline",
        metavar="REF",
        action="append",
        help="with --real, also run `live serve` as of git REF (a commit, branch or tag; checked "
        "out in a temporary worktree) beside this checkout's, in the same run; repeat for more",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="K",
        help="with --real, run every N K times, interleaved, and end with each path's median "
        "and range (run-to-run spread on a shared machine is often larger than a change)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the server at the largest N (needs py-spy; collapsed stacks in bench/results/)",
    )
    args = parser.parse_args(argv)
    if args.real:
        from bench import real

        return real.main(
            [int(s) for s in args.sessions.split(",")] if args.sessions else None,
            args.duration,
            args.warmup if "--warmup" in (argv if argv is not None else sys.argv) else None,
            quick=args.quick,
            json_path=args.json,
            sdk_wire=args.sdk_wire,
            profile=args.profile,
            baseline=args.baseline,
            repeat=args.repeat,
            workers=args.workers,
            gemini_endpoint=args.gemini_endpoint,
        )
    sizes = [int(s) for s in (args.sessions or ("1,20" if args.quick else "1,50,200")).split(",")]
    duration = args.duration or (4.0 if args.quick else 15.0)

    print(
        f"relay benchmark: N = {sizes}, {duration:g} s each, {args.workers} server "
        f"process(es), {os.cpu_count()} CPU(s)",
        flush=True,
    )
    stamp = f"{dt.datetime.now():%Y%m%d-%H%M%S}"
    if args.observability:
        return observability(sizes, duration, args.warmup, args.workers, args.json, stamp)
    rows = [
        measure(
            n,
            duration,
            profile=RESULTS / f"profile-relay-{n}-{stamp}.txt"
            if args.profile and n == max(sizes)
            else None,
            warmup=args.warmup,
            deflate=args.browser_deflate,
            workers=args.workers,
        )
        for n in sizes
    ]
    found = None
    search_rows: list[dict[str, Any]] = []
    if args.search:
        start = max([r["sessions"] for r in rows if r["relay"]["realtime"]] or [1])
        found, search_rows = search(
            start,
            args.search_duration,
            warmup=args.warmup,
            deflate=args.browser_deflate,
            workers=args.workers,
        )
        print(f"largest real-time N found: {found}; measuring it with the baseline", flush=True)
        if found and found not in sizes:
            rows.append(
                measure(
                    found,
                    duration,
                    warmup=args.warmup,
                    deflate=args.browser_deflate,
                    workers=args.workers,
                )
            )
    passing = [r["sessions"] for r in rows if r["relay"]["realtime"]]
    sdk = sdk_path_cost()
    report = {
        "benchmark": "relay",
        "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "git": _git(),
        "duration_s": duration,
        "browser_deflate": args.browser_deflate,
        "workers": args.workers,
        "rows": rows,
        "search": search_rows,
        "largest_realtime_sessions": found if args.search else (max(passing) if passing else 0),
        "largest_realtime_searched": bool(args.search),
        "sdk_path_cost": sdk,
    }
    print()
    print(table(rows))
    print()
    label = "found by search" if args.search else "of the sizes run"
    print(f"largest N with every stream real time ({label}): {report['largest_realtime_sessions']}")
    if sdk is not None:
        # What the real path would add per session-minute, at this load's rates.
        relay = rows[-1]["relay"]
        minutes = relay["sessions"] * relay["window_s"] / 60
        sdk["cpu_s_per_session_minute"] = (
            relay["up_frames_received"] / minutes * sdk["send_us_per_frame"]
            + relay["down_chunks_sent"] / minutes * sdk["receive_us_per_chunk"]
        ) / 1e6
        print(
            f"not in these figures (the double hands typed messages over): the SDK's own "
            f"work per message on the real path, {sdk['send_us_per_frame']:.0f} us per 20 ms "
            f"frame sent and {sdk['receive_us_per_chunk']:.0f} us per 40 ms chunk received: "
            f"{sdk['cpu_s_per_session_minute']:.3f} CPU s per session-minute more at this load"
        )
    path = Path(args.json) if args.json else RESULTS / f"relay-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
