"""Fixtures shared by the fleet tests."""
import pytest


@pytest.fixture
def no_hosts(monkeypatch):
    """Fails a test that would contact a host."""
    touched = []
    monkeypatch.setattr("bootstrap.remote.ssh.SSHHost.connect", lambda self: touched.append(self.name))
    yield touched
    assert touched == []
