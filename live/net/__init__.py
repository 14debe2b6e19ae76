"""The sockets the server listens and dials with: WebSocket connections on picows
(`websocket`), the layer a server listens with (`sockets`), the small HTTP/1.1
listener for POST routes (`http_post`, reading requests with `http_request`), and the event loop (`loop`)."""
