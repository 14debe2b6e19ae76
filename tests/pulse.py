"""A private PulseAudio daemon with virtual devices, for tests of real audio clients.

`mic` (the default source) hears whatever is played into the `micfeed` sink
(`paplay --device=micfeed`); `speaker` (the default sink) can be recorded from
`speaker.monitor`. Clients find it through `PULSE_SERVER` in `Pulse.env`.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest


@dataclasses.dataclass
class Pulse:
    env: dict[str, str]

    def pactl(self, *args: str) -> str:
        return subprocess.run(["pactl", *args], env=self.env, check=True, capture_output=True,
                              text=True, timeout=10).stdout.strip()


@pytest.fixture(scope="module")
def pulse(tmp_path_factory) -> Iterator[Pulse]:
    """A private PulseAudio: `mic` (fed through the `micfeed` sink) and `speaker` as defaults."""
    for tool in ("pulseaudio", "pactl", "paplay", "parec"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install pulseaudio pulseaudio-utils libasound2-plugins)")
    runtime = tmp_path_factory.mktemp("pulse")
    env = {
        **os.environ,
        "PULSE_RUNTIME_PATH": str(runtime),
        "PULSE_SERVER": f"unix:{runtime}/native",
        "HOME": str(runtime),
        "XDG_CONFIG_HOME": str(runtime / "config"),
        "PYTHONUNBUFFERED": "1",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    env.pop("PULSE_SINK", None)
    env.pop("PULSE_SOURCE", None)
    started = subprocess.run(
        ["pulseaudio", "--daemonize=yes", "-n", "--exit-idle-time=-1", "--disallow-exit",
         "--load=module-native-protocol-unix auth-anonymous=1",
         "--load=module-null-sink sink_name=speaker norewinds=1",
         "--load=module-null-sink sink_name=micfeed norewinds=1",
         "--load=module-remap-source source_name=mic master=micfeed.monitor"],
        env=env, capture_output=True, text=True, timeout=20,
    )
    if started.returncode != 0:
        pytest.skip(f"pulseaudio did not start: {started.stderr.strip()[-300:]}")
    daemon = Pulse(env)
    try:
        daemon.pactl("set-default-sink", "speaker")
        daemon.pactl("set-default-source", "mic")
        yield daemon
    finally:
        subprocess.run(["pulseaudio", "--kill"], env=env, capture_output=True, timeout=10)
