"""Tests: protocol and state as plain unit tests; the server, the app and the page for real."""
