"""A local Gemini Live endpoint that the unmodified google-genai SDK can talk to.

`running_emulator()` starts one in-process over TLS on a free port;
`emulator_client()` returns a `genai.Client` for it; `Script` decides what it
says, hears and breaks; each model family behaves as the real service does,
bad days included (`Profile`, `profile_for`), and `FaultRates` adds the
service's random faults; `live emulator` runs it from the command line.
The protocol logic lives in `core` (no I/O), the sockets in `server`.
"""

from connections.emulator.client import emulator_client, emulator_http_options
from connections.emulator.core import EmulatorSession, SessionRecord, Settings
from connections.emulator.faults import FaultRates
from connections.emulator.profiles import Profile, profile_for
from connections.emulator.script import QUOTA_REASON, Fault, ReplyContext, Script, ToolCall
from connections.emulator.server import DEV_API_KEY, Emulator, running_emulator
from connections.emulator.synth import speak

__all__ = [
    "DEV_API_KEY",
    "QUOTA_REASON",
    "Emulator",
    "EmulatorSession",
    "Fault",
    "FaultRates",
    "Profile",
    "ReplyContext",
    "Script",
    "SessionRecord",
    "Settings",
    "ToolCall",
    "emulator_client",
    "emulator_http_options",
    "profile_for",
    "running_emulator",
    "speak",
]
