"""The server's own turn-taking: voice detection and the turn decision, with no I/O.

`TurnController` (`controller`) is a plain state machine, like `SessionCore`:
fed the user's audio, the voice detector's score for each 32 ms window and
whether the agent is speaking, it answers with what to do: start the user's
activity (with the audio just before the onset), end it (and why), or leave
speech over the agent's reply alone. `VoiceStream` (`vad`) cuts one session's
audio into the detector's windows and keeps the detector's state for it as a
row, so one model run scores every session at once (`Silero`); `SmartTurn`
(`smart_turn`) listens to how a sentence ends. Their weights come from the
installed packages that ship them (`models`).
"""
