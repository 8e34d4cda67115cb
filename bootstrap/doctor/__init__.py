"""doctor and logs: log signatures and rules (pure) and the gathering over SSH (run.py)."""
