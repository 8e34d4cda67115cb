"""Helpers the tests call as functions (fixtures are in conftest.py); no test module imports another."""
