"""`--max-sessions auto`: the capacity follows this machine's speed at the relay's own work."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request

import pytest

from live.cli import capacity

LIVE = [sys.executable, "-m", "live.cli"]


def test_the_capacity_scales_with_how_fast_this_machine_does_the_work_of_a_frame():
    reference = capacity.estimate(capacity.REFERENCE_PROBE_US)
    # On the benchmark's machine: the sessions whose measured cost fills the allowed share of a core.
    assert reference.sessions == int(capacity.CORE_SHARE * 60 / capacity.REFERENCE_COST)
    assert reference.speed == pytest.approx(1.0)
    twice_as_fast = capacity.estimate(capacity.REFERENCE_PROBE_US / 2)
    assert twice_as_fast.speed == pytest.approx(2.0)
    assert twice_as_fast.sessions in (2 * reference.sessions, 2 * reference.sessions + 1)
    # A machine that barely runs the work still takes a few sessions.
    assert capacity.estimate(capacity.REFERENCE_PROBE_US * 1000).sessions == capacity.MIN_SESSIONS


def test_the_probe_gives_a_plausible_time_per_frame():
    probe = capacity.probe_us(rounds=50, tries=2)
    assert 0 < probe < 10_000  # microseconds for one frame's work, never a zero or a stall


def _serve(*argv: str) -> tuple[subprocess.Popen[str], int, dict]:
    proc = subprocess.Popen(
        [*LIVE, "serve", "--port", "0", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**{k: v for k, v in os.environ.items() if k not in ("GOOGLE_API_KEY", "GEMINI_API_KEY")},
             "NO_PROXY": "127.0.0.1,localhost"},
    )
    line = proc.stdout.readline()
    port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", line).group(1))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        health = json.loads(response.read())
    return proc, port, health


@pytest.mark.parametrize("argv", [(), ("--max-sessions", "7")])
def test_healthz_reports_the_capacity_the_server_took(argv):
    proc, _, health = _serve(*argv)
    try:
        proc.terminate()
        log = proc.communicate(timeout=15)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    said = re.search(r"capacity: up to (\d+) sessions at once in this process: a quick timing at start", log)
    if argv:
        assert health["max_sessions"] == 7 and said is None
    else:
        assert said is not None, log
        assert health["max_sessions"] == int(said.group(1)) >= capacity.MIN_SESSIONS
        assert health["near_capacity_at"] == -(-health["max_sessions"] * 9 // 10)


def test_a_capacity_that_is_not_a_number_is_refused_at_start():
    result = subprocess.run([*LIVE, "serve", "--max-sessions", "lots"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "--max-sessions: a positive number or auto, not 'lots'" in result.stderr


def test_local_voice_gets_the_capacity_of_a_model_that_runs_in_the_process():
    """local/voice recognises speech in the process, at about a tenth of real time
    per session: one core holds under ten of them, not the hundred a relay does."""
    assert capacity.estimate(capacity.REFERENCE_PROBE_US, "local/voice").sessions < 10
    assert capacity.estimate(capacity.REFERENCE_PROBE_US * 4, "local/voice").sessions >= 2
    proc, _, health = _serve("--model", "local/voice")
    try:
        proc.terminate()
        log = proc.communicate(timeout=15)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    said = re.search(r"capacity: up to (\d+) local/voice sessions at once in this process: it recognises speech here"
                     r".* found this machine ([\d.]+)x as fast", log)
    assert said is not None, log
    sessions, speed = int(said.group(1)), float(said.group(2))
    assert health["max_sessions"] == sessions
    # What this machine's speed gives local/voice (the speed is logged rounded), and
    # far under what it gives a relayed model: /healthz does not promise a relay's hundreds.
    probe = capacity.REFERENCE_PROBE_US / speed
    assert abs(sessions - capacity.estimate(probe, "local/voice").sessions) <= 1
    assert sessions * 10 < capacity.estimate(probe).sessions
