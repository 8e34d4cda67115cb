"""The `bootstrap` command: a thin click layer over the library face (bootstrap.face); the only package that prints.

Each command reads its options (params), makes one call to the face, prints the result (render) and
exits with its code. Progress and errors go to stderr, `--json` documents to stdout. Exit codes: see
errors.ExitStatus. The root group and how a command ends are in cli/app.py, the commands in
cli/commands_*.py (one module per section of the root help).
"""
from __future__ import annotations

# the commands register on import, a module per section of the root help (the order --help lists is SECTIONS')
from bootstrap.cli import commands_checks, commands_cluster, commands_observe, commands_serving, render
from bootstrap.cli.app import EXIT_MEANINGS, SECTIONS, _fail, _run, main
from bootstrap.cli.params import text_params
from bootstrap.cli.render import LineReporter

__all__ = ["EXIT_MEANINGS", "LineReporter", "SECTIONS", "_fail", "_run", "commands_checks", "commands_cluster",
           "commands_observe", "commands_serving", "main", "render"]

text_params(main)  # every string option and argument: an empty value is refused (params.Text)

if __name__ == "__main__":  # pragma: no cover
    main()
