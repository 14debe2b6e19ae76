"""Sample agents with real tools, runnable with `live serve --agent samples.NAME:agent`."""
