"""Coverage-guided fuzzing of every parser a stranger reaches (atheris, libFuzzer).

    pip install atheris                                  # not in an extra: a tool, not a dependency
    python -m bench.fuzz --target port_request --seconds 180
    python -m bench.fuzz --target all --seconds 180 --json bench/results/fuzz.json

Each target of `bench.fuzz_targets` runs in a process of its own, its parsers
instrumented, from the target's seeds (real messages of its wire); libFuzzer
mutates what reaches new code. A run reports, per target: inputs executed,
the coverage (edges) it started from and ended with, the inputs that reached
new code, and the crash if one was found (an input that breaks the target's
contract: any exception but the parser's own error, or an error logged), with
the file that reproduces it (`python -m bench.fuzz --target NAME --reproduce FILE`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

# What the targets parse with: instrumented, so that libFuzzer sees their branches.
INSTRUMENTED = ["live", "connections.emulator.wire", "h11", "websockets.http11", "websockets.datastructures", "jwt"]
# Loaded inside the instrumentation (anything loaded before it is not instrumented).
PRELOAD = [
    "live.net.http_request", "live.net.http_post", "live.server.port", "live.protocol", "live.doors.native",
    "live.doors.gemini_live", "live.doors.gemini_setup", "live.doors.gemini_tokens", "live.liveapi", "live.phone.webhooks", "live.phone.telnyx",
    "live.phone.twilio", "live.phone.carrier", "live.phone.calls", "live.phone.lines", "live.access.auth",
    "live.access.reattach", "live.access.addresses", "connections.emulator.wire", "h11", "jwt",
]


def _fuzz(name: str, seconds: int, corpus: Path, artifacts: Path) -> None:
    """In this process: fuzz one target until `seconds` pass or it crashes (libFuzzer exits)."""
    import atheris

    with atheris.instrument_imports(include=INSTRUMENTED):
        import importlib

        for module in PRELOAD:
            importlib.import_module(module)
        from bench.fuzz_targets import TARGETS
    # The targets' own log handler judges what is logged; nothing is printed.
    logging.getLogger().addHandler(logging.NullHandler())
    logging.getLogger().setLevel(logging.WARNING)
    target = TARGETS[name]
    corpus.mkdir(parents=True, exist_ok=True)
    for index, seed in enumerate(target.seeds):
        (corpus / f"seed-{index}").write_bytes(seed)
    target.check(*target.from_bytes(target.seeds[0]))  # load lazily imported parts now

    def one_input(data: bytes) -> None:
        target.check(*target.from_bytes(data))

    atheris.Setup(
        [sys.argv[0], str(corpus), f"-max_total_time={seconds}", "-print_final_stats=1",
         f"-artifact_prefix={artifacts}/{name}-", "-timeout=10", "-rss_limit_mb=2048", "-max_len=8192"],
        one_input,
    )
    atheris.Fuzz()


def _reproduce(name: str, path: Path) -> None:
    from bench.fuzz_targets import TARGETS

    target = TARGETS[name]
    target.check(*target.from_bytes(path.read_bytes()))
    print(f"{name}: {path} passes")


_STAT = re.compile(r"stat::(\w+):\s*(\d+)")
_DONE = re.compile(r"Done (\d+) runs in (\d+) second")
_PROGRESS = re.compile(r"#(\d+)\s+(INITED|DONE|NEW|REDUCE|pulse)\s+cov: (\d+) ft: (\d+)(?: corp: (\d+))?")


def _figures(name: str, seconds: int, output: str, code: int, took: float, artifacts: Path) -> dict[str, Any]:
    """One target's figures from libFuzzer's output."""
    stats = {key: int(value) for key, value in _STAT.findall(output)}
    progress = _PROGRESS.findall(output)
    inited = next((p for p in progress if p[1] == "INITED"), None)
    last = progress[-1] if progress else None
    crashes = sorted(str(p) for p in artifacts.glob(f"{name}-crash-*"))
    done = _DONE.search(output)
    error = None
    if code != 0:
        found = re.search(r"=== Uncaught Python exception: ===\n(.*)", output)
        error = found.group(1).strip() if found else "\n".join(output.strip().splitlines()[-3:])
    return {
        "target": name,
        "seconds": int(done.group(2)) if done else round(took, 1),  # fuzzing, without the start
        "executions": stats.get("number_of_executed_units", int(last[0]) if last else 0),
        "executions_per_second": stats.get("average_exec_per_sec"),
        "coverage_start": int(inited[2]) if inited else None,
        "coverage_end": int(last[2]) if last else None,
        "features_end": int(last[3]) if last else None,
        "new_units": stats.get("new_units_added"),
        "crashed": code != 0,
        "error": error,
        "crash_files": crashes,
    }


def run(names: list[str], seconds: int, workdir: Path) -> list[dict[str, Any]]:
    """Each target in a process of its own, one after another; their figures."""
    results = []
    for name in names:
        corpus, artifacts = workdir / "corpus" / name, workdir / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "bench.fuzz", "--target", name, "--seconds", str(seconds), "--workdir", str(workdir), "--child"],
            capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        figures = _figures(name, seconds, done.stdout + done.stderr, done.returncode, time.monotonic() - started, artifacts)
        (workdir / f"{name}.log").write_text(done.stdout + done.stderr)
        results.append(figures)
        print(_row(figures), flush=True)
    return results


def _row(f: dict[str, Any]) -> str:
    outcome = f"CRASH {f['error']} ({', '.join(f['crash_files'])})" if f["crashed"] else "no crash"
    return (f"{f['target']:15} {f['seconds']:>6} s  {f['executions']:>10,} runs  "
            f"cov {f['coverage_start']} -> {f['coverage_end']}  new units {f['new_units']}  {outcome}")


def main(argv: list[str] | None = None) -> list[dict[str, Any]] | None:
    from bench.fuzz_targets import TARGETS

    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, choices=[*TARGETS, "all"])
    parser.add_argument("--seconds", type=int, default=60, help="per target (default 60)")
    parser.add_argument("--workdir", type=Path, help="corpus, crash files and logs (default: a new temporary folder)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--reproduce", type=Path, help="run the target once on this input (a crash file)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reproduce:
        _reproduce(args.target, args.reproduce)
        return None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="live-fuzz-"))
    if args.child:
        _fuzz(args.target, args.seconds, workdir / "corpus" / args.target, workdir / "artifacts")
        return None
    names = list(TARGETS) if args.target == "all" else [args.target]
    print(f"fuzzing {', '.join(names)} for {args.seconds} s each; corpus, crashes and logs in {workdir}", flush=True)
    results = run(names, args.seconds, workdir)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"seconds_per_target": args.seconds, "targets": results}, indent=2))
    return results


if __name__ == "__main__":
    main()
