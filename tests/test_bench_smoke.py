"""The relay benchmark runs end to end and reports every figure (never its speed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bench import relay


def test_relay_benchmark_reports_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "relay.json"
    report = relay.main(
        ["--sessions", "2", "--duration", "4", "--warmup", "1", "--json", str(out)]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    (row,) = report["rows"]
    for mode in ("baseline", "relay"):
        result = row[mode]
        assert result["sessions"] == 2
        assert result["up"]["n"] > 0 and result["up"]["p99_ms"] is not None
        assert result["down"]["n"] > 0 and result["down"]["max_ms"] is not None
        assert result["interrupt"]["n"] > 0
        assert result["cpu_s_per_session_minute"] > 0
        assert result["rss_bytes"] > 0
        assert isinstance(result["dropped"], int)
    compare = row["compare"]
    for key in ("up_added_ms", "down_added_ms", "interrupt_added_ms"):
        assert set(compare[key]) == {"p50_ms", "p99_ms", "max_ms"}
    assert compare["cpu_ratio"] > 0
    assert isinstance(report["largest_realtime_sessions"], int)


def test_observability_benchmark_runs_metrics_off_on_and_recording(tmp_path: Path) -> None:
    out = tmp_path / "obs.json"
    report = relay.main(
        ["--observability", "--sessions", "2", "--duration", "3", "--warmup", "1", "--json", str(out)]
    )
    (row,) = json.loads(out.read_text())["rows"]
    assert report["benchmark"] == "relay-observability"
    for mode in ("relay-bare", "relay", "relay-record"):
        assert row[mode]["mode"] == mode
        assert row[mode]["up"]["n"] > 0 and row[mode]["down"]["n"] > 0
        assert row[mode]["cpu_s_per_session_minute"] > 0


def test_store_benchmark_reports_its_figures(tmp_path: Path) -> None:
    from bench import store

    out = tmp_path / "store.json"
    report = store.main(["--iterations", "5", "--json", str(out)])
    assert json.loads(out.read_text()) == report
    assert set(report["calls"]) == {"claim", "holder", "save_state_1k", "heartbeat_100_leases", "acquire_slot"}
    for figures in report["calls"].values():
        assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert set(report["failure"]) == {"killed_to_unavailable_ms", "frozen_to_unavailable_ms"}
    assert all(value > 0 for value in report["failure"].values())


def _worktrees() -> set[str]:
    """The repository's worktrees by path (other worktrees' commits come and go meanwhile)."""
    listed = subprocess.run(["git", "worktree", "list", "--porcelain"], capture_output=True, text=True, check=True)
    return {line.split(" ", 1)[1] for line in listed.stdout.splitlines() if line.startswith("worktree ")}


def test_real_path_benchmark_relays_audio_through_live_serve_and_reports_every_figure(
    tmp_path: Path,
) -> None:
    out = tmp_path / "real.json"
    worktrees_before = _worktrees()
    report = relay.main(
        # The load script's first turn is cut after about 1.1 s and its session
        # starts within the first 2.2 s (a fixed seed: here 0.3 s): in the window.
        ["--real", "--sessions", "1", "--duration", "3", "--warmup", "1", "--json", str(out),
         "--baseline", "HEAD"]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["benchmark"] == "relay-real"
    (row,) = report["rows"]
    assert row["failed"] == []
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
    # Ours, ours as of the baseline commit, and the verbatim floor relay on both socket layers, beside the direct run.
    assert {"direct", "live", f"live@{head.stdout.strip()}", "floor", "floor-websockets"} <= set(row["runs"])
    assert _worktrees() == worktrees_before  # the baseline's checkout is gone
    for name, result in row["runs"].items():
        assert result["sessions"] == 1
        assert result["connected"] == 1 and result["failed"] == [], result["failed"]
        assert result["upstream_closes"] == [], name
        # Audio went both ways: frames the client sent reached the emulator,
        # chunks the emulator sent reached the client, every one timed.
        assert result["up_frames_received"] > 0 and result["up"]["n"] == result["up_frames_received"]
        assert result["down_chunks_received"] > 0 and result["down"]["n"] == result["down_chunks_received"]
        # The model's interruption reached the client and was matched to its turn.
        assert result["interrupt"]["n"] >= 1 and result["interrupts_unmatched"] == 0
        for key in ("up", "down", "interrupt"):
            assert result[key]["p50_ms"] is not None and result[key]["p99_ms"] is not None
        assert isinstance(result["realtime"], bool) and isinstance(result["why_not_realtime"], list)
        assert result["emulator_late"]["n"] > 0 and result["generator_late"]["n"] > 0
    live = row["runs"]["live"]
    assert live["cpu_s_per_session_minute"] > 0
    assert live["rss_bytes"] > 0 and live["rss_per_session_bytes"] is not None
    assert row["runs"]["direct"]["cpu_s"] is None  # no relay in the baseline
    for key in ("up", "down", "interrupt"):
        assert set(row["added"]["live"][key]) == {"p50_ms", "p99_ms", "max_ms"}


def test_repeated_runs_end_with_each_paths_median_and_range() -> None:
    from bench import real

    def run(cpu: float, realtime: bool = True) -> dict:
        return {"cpu_s_per_session_minute": cpu, "realtime": realtime}

    def added(up: float, down: float) -> dict:
        return {"up": {"p99_ms": up}, "down": {"p99_ms": down}}

    rows = [
        {"sessions": 50, "runs": {"direct": run(None), "live": run(0.40), "floor": run(0.25)},
         "added": {"live": added(1.0, 2.0), "floor": added(0.5, 0.5)}},
        {"sessions": 50, "runs": {"direct": run(None), "live": run(0.50, realtime=False), "floor": run(0.27)},
         "added": {"live": added(3.0, 1.0), "floor": added(0.0, 1.5)}},
        {"sessions": 50, "runs": {"direct": run(None), "live": run(0.44), "floor": run(0.21)},
         "added": {"live": added(2.0, 4.0), "floor": added(1.0, 0.5)}},
    ]
    lines = real.spread(rows)
    assert lines == [
        "N=50 live over 3 runs: CPU s per session-min 0.440 (0.400 to 0.500), "
        "added p99 up ms +2.00 (+1.00 to +3.00), added p99 down ms +2.00 (+1.00 to +4.00); real time in 2",
        "N=50 floor over 3 runs: CPU s per session-min 0.250 (0.210 to 0.270), "
        "added p99 up ms +0.50 (+0.00 to +1.00), added p99 down ms +0.50 (+0.50 to +1.50); real time in 3",
    ]


def test_gemini_endpoint_benchmark_prints_each_paths_figures_and_what_the_endpoint_adds(capsys) -> None:
    from bench import gemini_endpoint

    report = gemini_endpoint.main(["--turns", "1", "--warmup", "0"])
    printed = capsys.readouterr().out.splitlines()
    assert report["upstream_connections"] == 3  # one a path, none replaced
    for path in ("direct", "endpoint", "endpoint-unpaced"):
        figures = report["paths"][path]
        for key in ("text_first", "text_done", "vad_first_audio", "end_first_audio"):
            assert figures[key]["n"] == 1 and figures[key]["median_ms"] > 0, (path, key)
        assert figures["audio_gap"]["n"] > 0 and figures["reply_span"]["n"] == 3
        # A row per measure: n, median, p90, p99; the endpoint's with what it adds.
        rows = [line.split() for line in printed if f" {path} " in f" {line} "]
        assert len(rows) == len(gemini_endpoint.MEASURES), printed
        for row in rows:
            numbers = row[row.index(path) + 1 :]
            assert len(numbers) in ((4,) if path == "direct" else (5, 7)), row
            assert all(float(n) == float(n) for n in numbers if n != "(paced)"), row
    assert set(report["added"]["endpoint-unpaced"]) == set(gemini_endpoint.MEASURES)
    assert "text_done" not in report["added"]["endpoint"]  # decided by the pacing, not comparable
    assert json.loads(json.dumps(report)) == report  # what --json writes


def test_real_path_benchmark_serves_the_live_api_endpoint_beside_live(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from bench import real

    monkeypatch.setattr(real, "REFERENCE_PEERS", ())  # direct, live and the endpoint alone
    out = tmp_path / "real.json"
    report = relay.main(
        ["--real", "--gemini-endpoint", "--sessions", "1", "--duration", "3", "--warmup", "1",
         "--json", str(out)]
    )
    printed = capsys.readouterr().out
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["peers"] == ["direct", "live", "live-endpoint"]
    (row,) = report["rows"]
    assert row["failed"] == []
    endpoint = row["runs"]["live-endpoint"]
    # The clients spoke the Live API's protocol to `live serve --gemini-endpoint`
    # over TLS with the run's token as their key, and it relayed their audio
    # both ways to the emulator and the model's interruption back.
    assert endpoint["connected"] == 1 and endpoint["alive"] == 1 and endpoint["failed"] == []
    assert endpoint["errors"] == {}
    assert endpoint["upstream_sessions_open"] == 1 and endpoint["upstream_closes"] == []
    assert endpoint["up_frames_received"] > 0 and endpoint["up"]["n"] == endpoint["up_frames_received"]
    assert endpoint["down_chunks_received"] > 0 and endpoint["down"]["n"] == endpoint["down_chunks_received"]
    assert endpoint["interrupt"]["n"] >= 1 and endpoint["interrupts_unmatched"] == 0
    assert endpoint["dropped"] == 0
    # Its own figures: the server process's CPU and memory, and what it adds to direct's latency.
    assert endpoint["cpu_s_per_session_minute"] > 0
    assert endpoint["rss_bytes"] > 0 and endpoint["rss_per_session_bytes"] is not None
    for key in ("up", "down", "interrupt"):
        assert None not in row["added"]["live-endpoint"][key].values()
    # Real time is judged as for every path, and the table has the endpoint's row.
    assert isinstance(endpoint["realtime"], bool)
    (line,) = [line for line in printed.splitlines() if line.startswith("| 1 | live-endpoint |")]
    assert f"| {endpoint['cpu_s_per_session_minute']:.3f} |" in line


def _commit_before(text: str, path: str) -> str:
    """The parent of the commit that first added `text` to `path`."""
    found = subprocess.run(
        ["git", "log", "--reverse", "--format=%H", f"-S{text}", "--", path],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    return f"{found[0]}^"


def test_an_endpoint_baseline_that_cannot_serve_as_the_run_does_says_why() -> None:
    from bench import real

    # Before `live serve` had --gemini-endpoint; then with it, but with tokens
    # that each open one session (every simulated user holds the same token).
    for ref, why in (
        (_commit_before("--gemini-endpoint", "live/"), "--gemini-endpoint"),
        (_commit_before("uses: int = 1", "live/"), "one session each"),
        ("HEAD", None),
    ):
        with real.baseline_peer(ref) as base:
            said = real.endpoint_unsupported(base)
        assert (said is None) if why is None else (why in (said or "")), (ref, said)


def test_turn_taking_cpu_runs_end_as_each_modes_median_and_spread() -> None:
    from bench import turns

    def run(mode: str, cpu: float, own: float = 0.0) -> dict:
        return {"mode": mode, "background": "quiet", "sessions": 50, "cpu_per_session_minute": cpu,
                "turn_taking_cpu_per_session_minute": own, "reply_share": 0.57, "real_time": 1.0,
                "rss_mb": 90.0, "failed": []}

    auto = turns.cpu_median([run("auto", 0.12), run("auto", 0.15), run("auto", 0.11)])
    server = turns.cpu_median([run("server", 0.13, 0.03), run("server", 0.12, 0.02), run("server", 0.18, 0.04)])
    base = turns.cpu_median([run("server@abc1234", 0.16, 0.04)])
    assert (auto["cpu_per_session_minute"], auto["cpu_range"], len(auto["runs"])) == (0.12, [0.11, 0.15], 3)
    assert server["turn_taking_cpu_per_session_minute"] == 0.03
    lines = turns.table({}, [auto, server, base]).splitlines()
    assert lines[0] == "| | `auto` | `server` | `server@abc1234` |"
    assert lines[2] == (
        "| CPU s per session-minute, 50 sessions, quiet, no one speaking over replies "
        "| 0.120 [0.110–0.150] (replies 57% of the time) "
        "| 0.130 [0.120–0.180] (replies 57% of the time, turn-taking 0.030) "
        "| 0.160 (replies 57% of the time, turn-taking 0.040) |"
    )
