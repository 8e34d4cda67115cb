"""-K/--ask-become-pass and $BOOTSTRAP_BECOME_PASSWORD: sudo's password for the hosts where the SSH user is
not root, read once per command (only the CLI asks); read_inventory puts it in the inventory's SSH settings.
"""
from __future__ import annotations

import os
import sys

import click

#: The variable a script gives sudo's password in (what -K asks for at a terminal).
BECOME_ENV = "BOOTSTRAP_BECOME_PASSWORD"
#: ctx.meta keys: -K was given (before the command or on it); the password read (read_inventory)
ASK_BECOME = "bootstrap.ask_become_pass"
BECOME_GIVEN = "bootstrap.become_password"


def _ask_become(ctx, param, value):
    if value:
        ctx.meta[ASK_BECOME] = True
    return value


#: -K as Ansible spells it, on the root and on every command that contacts the hosts.
become_option = click.option(
    "-K", "--ask-become-pass", is_flag=True, expose_value=False, callback=_ask_become,
    help="Ask once for the SSH user's sudo password, for hosts where the user is not root and sudo asks for one "
         f"(scripts: ${BECOME_ENV}). It reaches sudo on the SSH channel's stdin only.")





def become_password(ctx) -> str | None:
    """sudo's password for the hosts where the SSH user is not root: -K asks for it once (at a terminal),
    else $BOOTSTRAP_BECOME_PASSWORD; None when neither (sudo -n then). Asked once per command."""
    if ctx is not None and BECOME_GIVEN in ctx.meta:
        return ctx.meta[BECOME_GIVEN]
    value = os.environ.get(BECOME_ENV) or None
    if ctx is not None and ctx.meta.get(ASK_BECOME):
        if not (sys.stdin.isatty() and sys.stderr.isatty()):
            raise click.UsageError(f"-K/--ask-become-pass: no terminal to ask for the sudo password: set ${BECOME_ENV} "
                                   "instead", ctx)
        value = click.prompt("BECOME password", hide_input=True, default="", show_default=False, err=True) or None
    if ctx is not None:
        ctx.meta[BECOME_GIVEN] = value
    return value
