"""The only code that speaks to other machines: SSH, fan-out over hosts, the session, Docker argv."""
