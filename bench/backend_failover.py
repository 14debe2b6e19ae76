"""How long a conversation is without answers when its backend fails for good.

Two Live emulators are the backends A and B of one pool (`bench.emulated_backends`),
in real time (speed 1), and `live serve --backends` runs in front with its
default settings. A client asks a question, answered on A; then A fails, one
way per scenario:

- `quota`: A's key runs out of quota; the next question is closed on A with
  1011 RESOURCE_EXHAUSTED (timed from the question);
- `refuse`: A goes down, refusing connects (timed from the outage);
- `unavailable`: A goes down, 1011 on every setup, resumes too (from the outage);
- `model`: A stops serving the model, and drops the connection after an
  answer (timed from that answer's end).

and a question is asked at once. Measured: from the failure to the first
audio of the answer, on B. Beside it, the baseline: the same question on a
healthy backend, from the question to its first audio. Each run is a new
server and new emulators; prints each run, the median and the worst.

    .venv/bin/python -m bench.backend_failover --runs 10
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio

from bench.emulated_backends import MODEL, emulated_backends, script
from clients.client import AudioFrame, LiveClient
from connections.emulator import Fault
from live import protocol as p

SCENARIOS = ("quota", "refuse", "unavailable", "model")


async def _first_audio(client: LiveClient, *, timeout: float = 30.0) -> float:
    """When the first reply audio arrives (then the rest of the turn is read)."""
    first = None
    with anyio.fail_after(timeout):
        async for event in client.events():
            if first is None and isinstance(event, AudioFrame):
                first = time.monotonic()
            if isinstance(event, p.TurnComplete) and event.reason is None:
                break
    assert first is not None, "an answer without audio"
    return first


async def _ask(client: LiveClient, text: str) -> float:
    await client.send_text(text)
    return await _first_audio(client)


async def one_run(scenario: str) -> tuple[float, float]:
    """(failure to the next answer on B, the baseline question to its answer on A)."""
    a_script = script(speed=1, faults=[Fault("after_turn", code=1011, n=3)]) if scenario == "model" else script(speed=1)
    async with emulated_backends(("a", "b"), script_for={"a": a_script, "b": script(speed=1)}) as pool:
        server = pool.serve()
        a, b = pool.emulators["a"], pool.emulators["b"]
        try:
            async with LiveClient.connect(server.url) as client:
                await _ask(client, "q0x1")  # the session is up, and has answered
                asked = time.monotonic()
                baseline = await _ask(client, "q0x2") - asked
                if scenario == "quota":
                    a.outage.exhausted_keys.add(pool.keys["a"])
                    failed = time.monotonic()
                elif scenario in ("refuse", "unavailable"):
                    failed = time.monotonic()
                    await a.go_down(scenario)
                else:
                    a.outage.missing_models.add(f"models/{MODEL}")
                    await client.send_text("q0x3")  # the drop comes right after its answer
                    async for event in client.events():
                        if isinstance(event, p.TurnComplete):
                            break
                    failed = time.monotonic()
                answered = await _ask(client, "q0x4")
            assert "q0x2" in a.sessions[0].user_turns, "the baseline was not answered on A"
            assert b.sessions and "q0x4" in b.sessions[-1].user_turns, "not answered on B"
            assert len(b.sessions) == 1 and "q0x2" not in b.sessions[0].user_turns
        finally:
            server.stop()
    return answered - failed, baseline


async def main_async(runs: int, scenarios: list[str]) -> None:
    print(f"backend failover: {runs} runs per scenario, live serve defaults, emulators in real time, model {MODEL}")
    for scenario in scenarios:
        times, baselines = [], []
        for run in range(1, runs + 1):
            took, baseline = await one_run(scenario)
            times.append(took)
            baselines.append(baseline)
            print(f"  {scenario:<11} run {run:2d}: {took:5.2f} s to the next answer on B (healthy answer: {baseline:4.2f} s)", flush=True)
        print(
            f"{scenario:<11} failure -> answer on B: median {statistics.median(times):.2f} s, worst {max(times):.2f} s; "
            f"a healthy answer: median {statistics.median(baselines):.2f} s, worst {max(baselines):.2f} s",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="one scenario (repeatable; default all)")
    args = parser.parse_args(argv)
    anyio.run(main_async, args.runs, args.scenario or list(SCENARIOS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
