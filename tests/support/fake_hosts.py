"""Stand-ins for a host's SSH connection, for unit tests that must never open a socket.

FakeHost answers each command from a table (the first entry whose text is in the command line wins)
and fails loudly on a command it was not told about, so a test cannot pass by a step it did not
expect. `fake_session` is a real Session whose hosts are fakes.
"""
from __future__ import annotations

import shlex
from typing import Iterable, Sequence

from bootstrap.errors import CommandFailed
from bootstrap.model import Inventory, SSHSettings
from bootstrap.remote.session import Session
from bootstrap.remote.ssh import Result

#: What the Docker CLI prints when its daemon does not answer.
DOCKER_DOWN = (1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                      "Is the docker daemon running?")


class FakeHost:
    """answers: (text in the command line, answer); an answer is (exit code, stdout, stderr) or an
    exception to raise (HostUnreachable: the host does not answer)."""

    def __init__(self, name: str, answers: Sequence[tuple[str, object]] = (), *,
                 unreachable: BaseException | None = None):
        self.name = name
        self.answers = list(answers)
        self.unreachable = unreachable
        self.settings = SSHSettings()
        self.commands: list[str] = []
        #: what each run_with_input sent on stdin, in order
        self.inputs: list[bytes] = []
        #: sudo's password (SSHHost.become_password): none
        self.become_password: str | None = None
        #: the commands run as root (run_as_root), also in `commands`
        self.roots: list[str] = []

    def connect(self) -> "FakeHost":
        if self.unreachable is not None:
            raise self.unreachable
        return self

    def close(self) -> None:
        pass

    def _answer(self, argv: Sequence[str], check: bool) -> Result:
        self.connect()
        cmd = shlex.join(argv)
        self.commands.append(cmd)
        for text, answer in self.answers:
            if text in cmd:
                if isinstance(answer, BaseException):
                    raise answer
                code, out, err = answer
                res = Result(self.name, cmd, code, out, err)
                if check and not res.ok:
                    raise CommandFailed(self.name, cmd, code, (err or out)[-2000:])
                return res
        raise AssertionError(f"{self.name}: unexpected command {cmd}")

    def run(self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True,
            display: str | None = None, hangup: bool = False, query: bool = False) -> Result:
        return self._answer(argv, check)

    def run_with_input(self, argv: Sequence[str], chunks: Iterable[bytes], *, timeout: float | None = None,
                       check: bool = True, display: str | None = None) -> Result:
        self.inputs.append(b"".join(chunks))
        return self._answer(argv, check)


    def run_as_root(self, argv: Sequence[str], chunks: Iterable[bytes] = (), *, timeout: float | None = None,
                    check: bool = True, display: str | None = None, query: bool = False) -> Result:
        """As root: recorded as `(as root) CMD` (what the real host shows), answered by CMD's entry."""
        self.inputs.append(b"".join(chunks))
        self.roots.append(shlex.join(argv))
        return self._answer(argv, check)


def fake_session(inv: Inventory, hosts: dict[str, FakeHost], **kw) -> Session:
    """A real Session (stages, fan-out, GroupResult) whose hosts are the given fakes; every host of the
    inventory must have one."""
    sess = Session(inv, **kw)
    assert set(hosts) == set(sess.ssh), (sorted(hosts), sorted(sess.ssh))
    sess.ssh = dict(hosts)
    return sess


#: A root host with nft and a Ray token (bootstrap.cluster.guard.fence's facts), and the answers to taking
#: the fence and the token off (cluster.run.down): for fakes of hosts that `down` visits.
GUARD_FACTS = "home=/root\nclient=10.0.0.100\nsshd_port=22\nuid=0\nnft=yes\nsudo=no\nephemeral=32768 60999\n" \
              "token=0123456789abcdef\n"
GUARD_ANSWERS: list[tuple[str, object]] = [
    ("set -- $SSH_CLIENT", (0, GUARD_FACTS, "")),
    ("nft -f -", (0, "", "")),
    ("ray-auth-token.new", (0, "", "")),
    ("a secret there would rest on disk", (0, "", "")),  # the secrets on /run put (cluster.secretstore)
    ('rm -rf "$1"; rmdir "$2"', (0, "", "")),  # ... or removed
    ("docker rm -f bootstrap-image-mirror", (0, "", "")),  # a registry mirror left by a cold up, on a head
]
