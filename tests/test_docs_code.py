"""Every code block of the docs runs as written.

Each page of docs/ and the README is read top to bottom, as a reader follows
it, in a folder of its own: a Python block becomes a file (named by its first
line, `# talk.py`, else by its place) and is run (a file named `test_*.py` with
pytest, as in a project of the reader's own); a shell block runs line by line
in bash. A `live serve` (or a Python file that serves) keeps running for the
rest of the page, as in a second terminal, and a later one replaces it; at the
end of the page it gets Ctrl-C and must stop cleanly. Ports 8765 and 8766 are
replaced by free ones, so pages run beside each other and beside anything else.

A block that cannot run here says why just above it:
`<!-- docs-test: skip (needs a microphone and a speaker) -->`. Other
directives give a block what it needs: `emulator` (the Live emulator, with
GOOGLE_GEMINI_BASE_URL, SSL_CERT_FILE and a key set, as `live emulator` says
to export), `endpoint` (a server with the Live API's own endpoint over TLS, a
fresh token in LIVE_TOKEN for each block and a mint key in LIVE_MINT_KEY), `pipecat` (Python from
tests/.pipecat-venv, where ./test installs Pipecat). Only shell blocks may be
skipped; every Python block runs.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNS = {"python", "sh", "bash"}
SERVING = re.compile(r"^live: serving agent .* on (https?)://\S+:(\d+)/", re.M)
PIPECAT = ROOT / "tests" / ".pipecat-venv" / "bin" / "python"
SERVE_COMMAND = re.compile(r"^(\w+=\S+\s+)*live serve\b")


@dataclasses.dataclass
class Block:
    page: Path
    line: int
    lang: str
    code: str
    directive: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        found = re.fullmatch(r"skip \((.+)\)", self.directive)
        return found.group(1) if found else None

    @property
    def filename(self) -> str | None:
        found = re.match(r"# (\w+\.py)\b", self.code)
        return found.group(1) if found else None


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks that are code to run, with the directive above each."""
    lines = page.read_text().splitlines()
    out = []
    i = 0
    while i < len(lines):
        opening = re.fullmatch(r"(\s*)```(\w*)\s*", lines[i])
        if opening is None:
            i += 1
            continue
        indent, lang = opening.groups()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        body = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1 : end])
        above = lines[i - 1].strip() if i else ""
        directive = re.fullmatch(r"<!-- docs-test: (.+?) -->", above)
        if lang in RUNS:
            out.append(Block(page, i + 1, lang, body + "\n", directive.group(1) if directive else ""))
        i = end + 1
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Page:
    """One page's run: its folder, its ports, its environment and its servers."""

    def __init__(self, page: Path, folder: Path) -> None:
        self.page = page
        self.folder = folder
        self.ports = {"8765": str(free_port()), "8766": str(free_port())}
        venv_bin = str(Path(sys.executable).parent)
        self.env = {k: v for k, v in os.environ.items() if k not in ("GOOGLE_API_KEY", "GEMINI_API_KEY", "LIVE_TOKEN", "PULSE_SERVER")}
        self.env.update(
            PATH=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            PYTHONPATH=f"{folder}{os.pathsep}{ROOT}",
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
            LIVE_LOOP="auto",
        )
        if "LIVE_TOKEN_SECRET" in page.read_text():  # a page that exports one (every live serve then requires tokens)
            # A secret made as the docs once said (token_urlsafe) starts with "-" one time in 64:
            # the page's commands must take it, so this one always does.
            self.env["LIVE_TOKEN_SECRET"] = "-" + secrets.token_urlsafe(32)
        self.server: subprocess.Popen[str] | None = None
        self._endpoint: dict[str, str] | None = None
        self.helpers: list[subprocess.Popen[str]] = []
        self.ran: list[str] = []
        self.skipped: list[str] = []
        self.unavailable: list[str] = []  # Python blocks whose own environment is not installed here
        self.invoked = set(re.findall(r"^\s*python3? (\w+\.py)", "\n".join(
            b.code for b in blocks(page) if b.lang != "python"), flags=re.M))

    def text(self, code: str) -> str:
        for port, free in self.ports.items():
            code = re.sub(rf"(?<!\d){port}(?!\d)", free, code)
        return code.replace("live.example.com:", "127.0.0.1:")

    # ------------------------------------------------------------ servers

    def _start(self, argv: str | list[str], what: str, ready: re.Pattern[str], env: dict[str, str] | None = None,
               shell: bool = True) -> tuple[subprocess.Popen[str], str]:
        if shell:  # the server itself gets Ctrl-C, not a shell around it
            argv = ["bash", "-c", f"exec env {argv}"]
        proc = subprocess.Popen(argv, cwd=self.folder, env=env or self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        seen = ""
        deadline = time.monotonic() + 90
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen += line
            if ready.search(seen):
                return proc, seen
        proc.kill()
        raise AssertionError(f"{what} did not start:\n{seen}")

    def serve(self, command: str, block: Block, env: dict[str, str]) -> None:
        self.stop_server(block)
        if "--port" not in command.replace("--post-port", "") and SERVE_COMMAND.match(command):
            command = command.replace("live serve", f"live serve --port {self.ports['8765']}", 1)
        self.server, said = self._start(command, f"{block.where}: {command}", SERVING, env=env)
        scheme, port = SERVING.search(said).groups()  # type: ignore[union-attr]
        assert port in self.ports.values(), f"{block.where}: serving on {port}, not the page's port"

    def stop_server(self, block: Block) -> None:
        """Ctrl-C, as a reader stops it: it must stop cleanly."""
        server, self.server = self.server, None
        if server is None:
            return
        os.killpg(server.pid, signal.SIGINT)
        try:
            out, _ = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.communicate()
            raise AssertionError(f"{block.where}: the server did not stop on Ctrl-C") from None
        assert server.returncode == 0, f"{block.where}: the server ended with {server.returncode}:\n{out[-3000:]}"
        assert "Traceback" not in out, out[-3000:]

    def close(self) -> None:
        try:
            if self.server is not None:
                self.stop_server(Block(self.page, 0, "sh", ""))
        finally:
            for helper in self.helpers:
                if helper.poll() is None:
                    os.killpg(helper.pid, signal.SIGKILL)
                    helper.communicate()

    # ------------------------------------------------------------ what blocks need

    def with_emulator(self) -> dict[str, str]:
        proc, said = self._start(["live", "emulator", "--port", "0"], "live emulator",
                                 re.compile(r"export SSL_CERT_FILE=\S+\n"), shell=False)
        self.helpers.append(proc)
        env = dict(self.env, GOOGLE_API_KEY="emulator-dev-key")
        for name, value in re.findall(r"export (GOOGLE_GEMINI_BASE_URL|SSL_CERT_FILE)=(\S+)", said):
            env[name] = value
        return env

    def with_endpoint(self) -> dict[str, str]:
        if self._endpoint is None:
            self._endpoint = self._start_endpoint()
        return self._endpoint

    def _start_endpoint(self) -> dict[str, str]:
        import trustme

        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        ca.cert_pem.write_to_path(str(self.folder / "ca.pem"))
        cert.private_key_and_cert_chain_pem.write_to_path(str(self.folder / "server.pem"))
        mint_key = secrets.token_urlsafe(32)
        env = dict(self.env, LIVE_MINT_KEY=mint_key, LIVE_TOKEN_SECRET=self.env.get("LIVE_TOKEN_SECRET") or secrets.token_urlsafe(32))
        proc, _ = self._start(
            ["live", "serve", "--gemini-endpoint", "--gemini-model", "*", "--certfile", "server.pem",
             f"--token-secret={env['LIVE_TOKEN_SECRET']}", f"--mint-key={mint_key}",
             "--port", self.ports["8765"], "--max-sessions", "4"],
            "live serve --gemini-endpoint", SERVING, env=env, shell=False,
        )
        self.helpers.append(proc)
        return dict(env, SSL_CERT_FILE=str(self.folder / "ca.pem"))

    def env_for(self, block: Block) -> dict[str, str]:
        if block.directive == "emulator":
            return self.with_emulator()
        if block.directive == "endpoint":
            self.stop_server(block)  # the endpoint's server takes the page's port
            env = self.with_endpoint()
            # A token opens one session: each app of the page gets its own, as the page says to mint one per session.
            token = subprocess.run(["live", "token", f"--secret={env['LIVE_TOKEN_SECRET']}", "--ttl", "300"],
                                   cwd=self.folder, env=env, capture_output=True, text=True, check=True).stdout.strip()
            return dict(env, LIVE_TOKEN=token)
        return self.env

    # ------------------------------------------------------------ running

    def run(self, block: Block) -> None:
        reason = block.skip_reason
        if reason is not None:
            assert block.lang != "python", f"{block.where}: every Python block runs"
            self.skipped.append(f"{block.where} ({reason})")
            return
        if block.lang == "python":
            self.run_python(block)
        else:
            self.run_shell(block)
        if not self.unavailable or self.unavailable[-1].split(":")[0:2] != block.where.split(":")[0:2]:
            self.ran.append(block.where)

    def run_python(self, block: Block) -> None:
        name = block.filename or f"block_{block.line}.py"
        path = self.folder / name
        path.write_text(self.text(block.code))
        if name in self.invoked:
            return  # a shell block of the page runs it, as the page says
        env = self.env_for(block)
        python = sys.executable
        if block.directive == "pipecat":
            if not PIPECAT.exists():
                self.unavailable.append(f"{block.where}: Pipecat is not installed (./test makes tests/.pipecat-venv)")
                return
            python = str(PIPECAT)
        if "server.serve" in block.code:
            self.stop_server(block)
            self.server, _ = self._start([python, name], f"{block.where}: python {name}", SERVING, env=env, shell=False)
            return
        argv = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", name] if name.startswith("test_") else [python, name]
        done = subprocess.run(argv, cwd=self.folder, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{block.where}: {' '.join(argv)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

    def run_shell(self, block: Block) -> None:
        env = self.env_for(block)
        for command in shell_lines(self.text(block.code)):
            if SERVE_COMMAND.match(command) or (command.startswith("python") and self._serves(command)):
                self.serve(command, block, env)
                continue
            if command.startswith("live emulator"):  # it serves until stopped, as in a terminal of its own
                proc, _ = self._start(command + " --port 0", f"{block.where}: {command}",
                                      re.compile(r"export SSL_CERT_FILE=\S+\n"), env=env)
                self.helpers.append(proc)
                continue
            done = subprocess.run(["bash", "-c", command], cwd=self.folder, env=env, capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, f"{block.where}: `{command}` failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

    def _serves(self, command: str) -> bool:
        name = shlex.split(command)[1] if len(shlex.split(command)) > 1 else ""
        path = self.folder / name
        return path.is_file() and "server.serve" in path.read_text()


def shell_lines(code: str) -> Iterator[str]:
    """Commands, one a line (a trailing backslash continues it); comments and blanks left out."""
    for line in re.sub(r"\\\n\s*", " ", code).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            yield line


# A page starts servers, emulators and other Pythons, each with a deadline to
# start in: under the whole suite's load on two cores one may miss it. A page
# that is wrong fails again on its second run.
@pytest.mark.flaky(reruns=1)
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_block_of_the_page_runs(page: Path, tmp_path: Path) -> None:
    runner = Page(page, tmp_path)
    try:
        for block in blocks(page):
            runner.run(block)
    finally:
        runner.close()
    print(f"{page.relative_to(ROOT)}: ran {len(runner.ran)} blocks; not run: {runner.skipped or 'none'}")
    if runner.unavailable:
        pytest.skip("; ".join(runner.unavailable))


def test_the_docs_hold_python_blocks_and_say_why_a_block_is_not_run() -> None:
    every = [b for page in PAGES for b in blocks(page)]
    python = [b for b in every if b.lang == "python"]
    assert len(python) >= 19
    assert not [b.where for b in python if b.skip_reason is not None]
    for block in every:
        assert block.directive in ("", "emulator", "endpoint", "pipecat") or block.skip_reason, (
            f"{block.where}: unknown directive {block.directive!r}"
        )
