"""Tools for testing agents and servers: replaying a session record against the
server and comparing what it does (`replay`, `assert_replays`)."""
