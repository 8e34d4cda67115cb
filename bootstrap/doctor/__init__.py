"""doctor and logs: where the logs are (logsources.py, pure) and the gathering over SSH (run.py)."""
