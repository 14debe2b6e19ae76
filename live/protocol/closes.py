"""The WebSocket close codes the server's sockets end with (RFC 6455 and the IANA
registry), whichever front door a client came through."""

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_INTERNAL",
    "CLOSE_NORMAL",
    "CLOSE_POLICY",
    "CLOSE_SERVICE_RESTART",
    "CLOSE_TOO_BIG",
    "CLOSE_TRY_LATER",
]

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_SERVICE_RESTART = 1012
CLOSE_TRY_LATER = 1013
