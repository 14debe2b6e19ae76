"""`local/voice`: a built-in model that listens and speaks with no key and no network.

Silero VAD finds speech and barge-in, PocketSphinx recognises it (with a
vocabulary biased towards the agent's tools), simple word matching decides
the reply or the tool call (`matching`), and eSpeak NG speaks it at 24 kHz.
"""

from connections.local_voice.listener import ListenConfig
from connections.local_voice.model import LocalVoice, LocalVoiceConnection, VoiceConfig, word_error_rate

__all__ = ["ListenConfig", "LocalVoice", "LocalVoiceConnection", "VoiceConfig", "word_error_rate"]
