"""Serving protocol v2: the server, connections, requests, outbox, admission, stats, child process."""
