"""The sockets the server listens and dials with: WebSocket connections on picows
(`websocket`), the layer a server listens with (`sockets`), a connection's first
bytes telling a POST from a WebSocket handshake on one port (`one_port`), the
small HTTP/1.1 listener for POST routes (`http_post`, reading requests with
`http_request`), and the event loop (`loop`)."""
