"""Development tooling shared by tests, benchmarks and scripts: the dashboard's processes on this
machine, its websocket frames, the page's closed panels opened in chromium."""
