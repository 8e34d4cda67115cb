"""bootstrap: bare-metal GPU machines over SSH and Docker -> one vLLM serving service.

The package map and the import rules are in docs/architecture.md.
"""
__version__ = "0.1.0"
