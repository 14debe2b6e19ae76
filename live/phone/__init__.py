"""Phone calls: carriers' media streams as front doors (`live.phone.twilio`).

`live.phone.audio` is the telephone side of the audio (G.711 at 8 kHz, 20 ms
frames, streaming resamplers); `live.phone.twilio` maps Twilio's Media Streams
messages to session inputs and back; `live.phone.webhooks` answers the voice
webhook that sends a call here.
"""
