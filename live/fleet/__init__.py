"""Several servers sharing sessions through one store: a server's part in the
fleet, its leases and the global cap (`member`), the backends' breakers
(`health`), and the store itself, in memory or on Redis (`store`)."""
