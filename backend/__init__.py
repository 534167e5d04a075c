"""Websocket backend: serves protocol v1 over any engine of the Engine interface."""
