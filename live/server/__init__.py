"""The server: one port (`port`), and for each conversation a session runner
(`runner`) between the client's attachment (`attachment`) and the model link
(`model_link`), with its tool tasks and bounded queues, on the backends of its
pool (`backends`); the POST routes its port serves too (`posts`); `config`
says what it allows.

`LiveServer` and `ServerConfig` are also importable from `live` itself.
"""
