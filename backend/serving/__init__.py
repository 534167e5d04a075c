"""Serving protocol v1: the server, connections, requests, outbox, admission, stats, child process."""
