"""Front doors: the wire protocols clients reach a session through (`live.doors.base`)."""

from live.doors.base import Capabilities, FrontDoor, Input, Opening, PlayedOut
from live.doors.native import NativeDoor

__all__ = ["Capabilities", "FrontDoor", "Input", "NativeDoor", "Opening", "PlayedOut"]
