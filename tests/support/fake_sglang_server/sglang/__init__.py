"""Stand-in SGLang package: only `sglang.launch_server` (see launch_server.py)."""
