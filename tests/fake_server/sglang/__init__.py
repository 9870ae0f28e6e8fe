"""A fake ``sglang`` package for lifecycle tests: ``python -m sglang.launch_server`` runs a tiny
HTTP server whose faults are chosen by environment variables (see launch_server.py). Real
sglang is used everywhere a real server can show the behaviour; this covers what it cannot be
made to do on demand (slow readiness, 400 from flush, death mid-run, a stubborn grandchild)."""

__version__ = "0.0.0+fake"
