"""Development tooling shared by tests, benchmarks and scripts: the dashboard's processes on this machine."""
