"""A shell script run as root, in a form that a sudoers rule can allow whole (pure).

sudo compares a command's arguments as one string, its words joined by spaces, so a rule that allows
`sh -c SCRIPT NAME ARGS...` also allows the same words split elsewhere: a prefix of SCRIPT run with the
rest of its words as $0 and arguments. Each script therefore starts by checking its $0 (ARGV0, a word
that appears nowhere else in it) and its argument count, and stops otherwise: a split script meets a $0
that is one of its own words, or a count that is not its own (guard.sudoers).
"""
from __future__ import annotations

#: $0 of every script bootstrap runs as root through `sh -c`.
ARGV0 = "bootstrap-root"
#: Exit status of a script run with words it was not written for.
MISUSED = 9


def root_sh(script: str, *args: str) -> tuple[str, ...]:
    """`sh -c GUARD+SCRIPT ARGV0 ARGS...`: SCRIPT runs only with exactly these many arguments and this $0."""
    guard = f'[ "$0" = {ARGV0} ] && [ $# -eq {len(args)} ] || exit {MISUSED}; '
    return ("sh", "-c", guard + script, ARGV0, *args)
