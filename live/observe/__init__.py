"""Watching sessions: Prometheus metrics (`metrics`), the model side measured and
recorded as decorators and the client side as an observer (`watch`), session
records (`record`) and structured logs (`logs`)."""
