"""check-nccl: the pure parser and verdicts (parse.py) and the run over SSH (run.py)."""
