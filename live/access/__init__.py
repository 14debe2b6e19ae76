"""Who may talk to the server: session tokens and the Host and Origin checks
(`auth`), the client's address behind trusted proxies (`addresses`), and what a
client needs to come back after a dropped socket (`reattach`)."""
