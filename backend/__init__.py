"""Websocket backend: serves protocol v2 over any engine of the Engine interface."""
