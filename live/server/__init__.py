"""The server: one port (`port`: its HTTP routes in `http_routes`, its limits in
`admission`, resumes in `resumes`, stopping in `draining`), and for each
conversation a session runner (`runner`: the client's frames in `client_input`,
the server's own turns in `server_turns`, what the user heard in
`heard_replies`, its part in a fleet in `fleet_handover`) between the client's
attachment (`attachment`) and the model link (`model_link`), with its tool
tasks and bounded queues, on the backends of its pool (`backends`); the POST
routes its port serves too (`posts`); `config` says what it allows.

`LiveServer` and `ServerConfig` are also importable from `live` itself.
"""
