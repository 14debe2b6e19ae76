"""The session engine: the rules of one conversation, as state machines with no I/O.

`SessionCore` (turns, tool calls, interruptions, model connections as epochs),
the `Supervisor` (when to replace a model connection, and when to move it to
another backend: `failover`, with each backend's circuit breaker: `breaker`),
what a new connection
must be told (`handover`), the conversation as the session heard it
(`transcript`), what the user heard of an interrupted reply (`heard`). The
server's runner feeds them what happens and carries out the actions they answer
with (`actions`).
"""
