"""Settings and flags: limits and defaults, and the command lines of app.py and `python -m backend`."""
