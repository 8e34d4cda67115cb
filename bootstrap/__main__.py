"""`python -m bootstrap`: the same as the `bootstrap` command."""
from bootstrap.cli import main

main()
