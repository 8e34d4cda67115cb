"""Preflight: one registry of checks (checks.py) that `up` runs before it changes anything and `doctor` on demand.

registry.py says what a check is (`Check`), what it reads (`Seen`) and what it finds (`Finding`);
checks.py holds every check, one entry each; rules.py and ports.py are the pure rules the checks
apply; run.py gathers what they read over SSH and turns findings into refusals.
"""
