"""SSH transport: the only module that moves bytes to and from hosts.

Commands arrive as argv tuples and are quoted once, here (``shlex.join``). One Fabric
``Connection`` per host is opened once and reused across stages. Host keys are verified against
known_hosts by default; trusting a new key is opt-in and a changed key is always refused.
"""
from __future__ import annotations

import errno
import logging
import select
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Sequence

import paramiko
from fabric import Config, Connection

from bootstrap.errors import CommandFailed, ConnectionLost, HostUnreachable, LockBusy, LockLost
from bootstrap.model import Host, SSHSettings
from bootstrap.remote.become import BECOME, become_password, password_first

Argv = Sequence[str]

KNOWN_HOSTS = "~/.ssh/known_hosts"

# Paramiko logs failures of its transport thread with tracebacks (to stderr via logging's
# last-resort handler); every one of them reaches the user as one HostUnreachable line instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False
STREAM_CHUNK = 1 << 20
#: Seconds a lock held on a connection that dropped gets to come free (its remote holder exits once
#: sshd sees the channel gone) before a new connection takes it again.
RETAKE_WAIT = 10.0


@dataclass(frozen=True)
class Result:
    host: str
    command: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Trust a key never seen before and record it (ssh's StrictHostKeyChecking=accept-new).

    Paramiko raises BadHostKeyException itself for a *changed* key, before any policy runs.
    """

    _lock = threading.Lock()

    def __init__(self, save_to: Path) -> None:
        self.save_to = save_to

    def missing_host_key(self, client, hostname, key):  # noqa: ANN001 - paramiko's signature
        client.get_host_keys().add(hostname, key.get_name(), key)
        with self._lock:
            self.save_to.parent.mkdir(parents=True, exist_ok=True)
            with open(self.save_to, "a", encoding="ascii") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def _jump_parts(jump: str) -> tuple[str | None, str, int | None]:
    """A jump host as the inventory takes it, `[user@]host[:port]` with an IPv6 host bare or in
    brackets (`[2001:db8::7]:2`), as (user, host without brackets, port)."""
    user, _, hostport = jump.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") else None
    elif hostport.count(":") == 1:
        host, p = hostport.split(":")
        port = int(p)
    return (user or None), host, port


def _close_quietly(conn: Connection) -> None:
    try:
        conn.close()
    except Exception:  # a transport another thread is tearing down (see SSHHost.close)
        pass


#: Called as trace(host, command as shown, exit status or None at a timeout, seconds) after each
#: command run over SSH (the CLI's run log and -v set it; None: nothing).
trace: Callable[[str, str, int | None, float], None] | None = None


def _traced(host: str, shown: str, code: int | None, started: float) -> None:
    if trace is not None:
        try:
            trace(host, shown, code, time.monotonic() - started)
        except Exception:  # noqa: BLE001 - a log that cannot be written never fails a command
            pass


class SSHHost:
    """One host's SSH session. Constructing it does no I/O; :meth:`connect` does."""

    def __init__(self, host: Host, settings: SSHSettings, *, sleep: Callable[[float], None] = time.sleep):
        self.host = host
        self.name = host.name
        self.settings = settings
        self._sleep = sleep
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        #: locks taken on this host (path -> (holder, the channel holding it)); close() forgets them, so
        #: any left when a new connection opens were held on one that dropped (see _retake)
        self._held: dict[str, tuple[str, paramiko.Channel]] = {}

    # -- connection -------------------------------------------------------------------------
    def _configure_keys(self, conn: Connection) -> None:
        client = conn.client
        system = Path(KNOWN_HOSTS).expanduser()
        if system.exists():
            client._system_host_keys = _parsed_host_keys(system)  # what load_system_host_keys fills
        save_to = system
        if self.settings.known_hosts:
            extra = Path(self.settings.known_hosts).expanduser()
            if extra.exists():
                client._host_keys = _parsed_host_keys(extra)  # what load_host_keys fills
            save_to = extra
        if self.settings.accept_new_host_keys:
            client.set_missing_host_key_policy(_AcceptNewPolicy(save_to))
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())

    def _build(self) -> Connection:
        t = self.host.ssh
        kwargs: dict = {"connect_timeout": int(max(1, self.settings.connect_timeout))}
        connect_kwargs: dict = {"banner_timeout": self.settings.connect_timeout,
                                "auth_timeout": self.settings.connect_timeout}
        if t.key:
            connect_kwargs["key_filename"] = [str(Path(t.key).expanduser())]
        gateway = None
        if t.jump:
            juser, jhost, jport = _jump_parts(t.jump)
            gateway = Connection(jhost, user=juser or t.user, port=jport, config=Config(),
                                 connect_timeout=kwargs["connect_timeout"],
                                 connect_kwargs=dict(connect_kwargs))
        conn = Connection(t.address, user=t.user, port=t.port, config=Config(), gateway=gateway,
                          connect_kwargs=connect_kwargs, **kwargs)
        # Fabric trusts every host key by default (AutoAddPolicy) and so do the gateway
        # connections it builds from ProxyJump: verify them all.
        node = conn
        while isinstance(node, Connection):
            self._configure_keys(node)
            node = node.gateway
        return conn

    def connect(self) -> "SSHHost":
        with self._lock:
            if self._conn is not None and self._conn.is_connected:
                return self
            attempts = 1 + max(0, self.settings.connect_retries)
            delay = 0.5
            last: Exception | None = None
            for attempt in range(attempts):
                conn = self._build()
                started = time.monotonic()
                try:
                    conn.open()
                    if self._held:
                        self._retake(conn)
                    self._conn = conn
                    return self
                except paramiko.BadHostKeyException as exc:
                    raise HostUnreachable(
                        self.name,
                        f"host key for {exc.hostname} has CHANGED (expected {exc.expected_key.get_name()} "
                        f"{exc.expected_key.get_fingerprint().hex()[:16]}..., got "
                        f"{exc.key.get_fingerprint().hex()[:16]}...); refusing to connect",
                        "if the host was reinstalled, verify the new key and run "
                        f"`ssh-keygen -R {exc.hostname}`",
                    ) from None
                except paramiko.AuthenticationException as exc:
                    who = conn.user or "?"
                    key = self.host.ssh.key or "your default keys/agent"
                    raise HostUnreachable(self.name, f"authentication failed for user {who!r} ({exc})",
                                          f"check the user and key ({key})") from None
                except paramiko.SSHException as exc:
                    if "not found in known_hosts" in str(exc):
                        raise HostUnreachable(
                            self.name, f"host key of {self.host.ssh.address} is not in known_hosts",
                            "verify it and add it (ssh-keyscan -H HOST >> ~/.ssh/known_hosts), set "
                            "cluster.ssh.known_hosts, or trust it on first use with "
                            "--accept-new-host-keys",
                        ) from None
                    last = exc
                    if time.monotonic() - started >= 0.9 * self.settings.connect_timeout:
                        # TCP answered but sshd did not (a frozen or overloaded host): a timeout.
                        conn.close()
                        last = socket.timeout(f"no SSH banner within {self.settings.connect_timeout:g}s")
                        break
                except (OSError, socket.timeout, EOFError) as exc:
                    last = exc
                    if not _transient(exc):
                        # Nobody answered within connect_timeout (or there is no route): retrying
                        # would only multiply the wait. Refused/reset (sshd restarting) is retried.
                        conn.close()
                        break
                conn.close()
                if attempt + 1 < attempts:
                    self._sleep(delay)
                    delay = min(delay * 2, 5.0)
            reason = str(last) or type(last).__name__
            if isinstance(last, (socket.timeout, TimeoutError)):
                reason = str(last) if "banner" in str(last) else f"timed out after {self.settings.connect_timeout:g}s"
            tries = f" ({attempt + 1} attempts)" if attempt else ""
            raise HostUnreachable(self.name, f"{self.host.ssh.address}: {reason}{tries}",
                                  "is the host up and sshd listening? check address/port/jump")

    @property
    def conn(self) -> Connection:
        if self._conn is None:
            self.connect()
        assert self._conn is not None
        return self._conn

    def close(self) -> None:
        """Best effort: after Ctrl-C another thread can be tearing the same transport down (the
        command in flight failing), and paramiko's Transport.close then trips over a channel that
        thread already unlinked (AttributeError: 'NoneType' object has no attribute
        '_unlink_channel', seen in the interrupt test). The socket is gone either way."""
        with self._lock:
            conn, self._conn = self._conn, None
            self._held.clear()  # their channels close with the connection: released
        if conn is not None:
            _close_quietly(conn)

    def _drop(self, conn: Connection) -> None:
        """Forget ``conn`` after it failed under us, unless another thread already replaced it.
        Locks held on it go with it: the next connection takes them again before any command."""
        with self._lock:
            if self._conn is conn:
                self._conn = None
        _close_quietly(conn)

    def _retake(self, conn: Connection) -> None:
        """Take every lock we held again on a new connection, the old one having dropped (sshd
        restarted, a network blip): otherwise a run would go on changing hosts without its lock,
        and a second run could take it meanwhile (seen in CI). The old holder exits when sshd notices
        its channel is gone; RETAKE_WAIT gives it that time. Raises :class:`LockLost` (and closes
        ``conn``) when another run holds it now."""
        for path, (holder, _) in list(self._held.items()):
            try:
                chan = self._take(conn, path, holder, wait=RETAKE_WAIT)
            except LockBusy as exc:
                self._held.clear()
                _close_quietly(conn)
                raise LockLost(self.name, path, exc.holder, ours=exc.holder == holder) from None
            self._held[path] = (holder, chan)

    # -- commands ---------------------------------------------------------------------------
    def run(self, argv: Argv, *, timeout: float | None = None, check: bool = True,
            display: str | None = None, hangup: bool = False, query: bool = False) -> Result:
        """Run one command (stdin at EOF). ``display`` replaces the command line in errors.

        ``hangup``: the remote command is killed (SIGTERM) as soon as this channel closes, e.g.
        when we are interrupted or the connection drops; use it for long work such as a pull.
        ``query``: the command only reads; when the connection drops under it, connect again
        once and ask again (an sshd that drops a session must not fail a whole `up`).
        """
        if hangup:
            return self._exec(("sh", "-c", _HANGUP, "sh", *argv), (), timeout=timeout, check=check,
                              display=display or shlex.join(argv), keep_stdin=True)
        try:
            return self._exec(argv, (), timeout=timeout, check=check, display=display)
        except ConnectionLost:
            if not query:
                raise
        return self._exec(argv, (), timeout=timeout, check=check, display=display)

    def run_with_input(self, argv: Argv, chunks: Iterable[bytes], *, timeout: float | None = None,
                       check: bool = True, display: str | None = None) -> Result:
        """Run a command with a byte stream on its stdin (e.g. ``docker load`` of a saved image)."""
        return self._exec(argv, chunks, timeout=timeout, check=check, display=display)

    @property
    def become_password(self) -> str | None:
        return become_password(self.host, self.settings)

    def run_as_root(self, argv: Argv, chunks: Iterable[bytes] = (), *, timeout: float | None = None,
                    check: bool = True, display: str | None = None, query: bool = False) -> Result:
        """Run one command as root: as it is where the SSH user is root, else by sudo. With a become
        password (the host's, else the settings': -K, $BOOTSTRAP_BECOME_PASSWORD) it travels as the
        first line of the channel's stdin, never on a command line: sudo reads it through an askpass
        program (become.BECOME) only when it asks, so a NOPASSWD rule or a cached login never passes it to
        the command. Without one, `sudo -n`. ``chunks`` follow on the command's stdin."""
        password = self.become_password
        shown = "(as root) " + (display or shlex.join(argv))
        if password is None:
            wrapped, sent = ("sh", "-c", BECOME, "sh", "n", *argv), chunks
        else:
            wrapped, sent = ("sh", "-c", BECOME, "sh", "pw", *argv), password_first(password, chunks)
        try:
            return self._exec(wrapped, sent, timeout=timeout, check=check, display=shown)
        except ConnectionLost:
            if not query:
                raise
        return self._exec(wrapped, password_first(password, chunks) if password is not None else chunks,
                          timeout=timeout, check=check, display=shown)

    def _exec(self, argv: Argv, chunks: Iterable[bytes], *, timeout: float | None, check: bool,
              display: str | None = None, keep_stdin: bool = False) -> Result:
        cmd = shlex.join(argv)
        shown = display or cmd
        timeout = self.settings.command_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        conn = self.conn
        try:
            chan = conn.transport.open_session(timeout=self.settings.connect_timeout)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self._drop(conn)
            raise ConnectionLost(self.name, f"connection lost before `{shown}`: {exc}") from None
        try:
            chan.settimeout(max(0.1, timeout))
            chan.exec_command(cmd)
            for chunk in chunks:
                chan.sendall(chunk)
            if not keep_stdin:
                chan.shutdown_write()
            chan.settimeout(0.0)
            while True:
                got = False
                while chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if chan.exit_status_ready() and chan.eof_received and not chan.recv_ready() \
                        and not chan.recv_stderr_ready():
                    break
                if time.monotonic() > deadline:
                    raise socket.timeout()
                if not got and (chan.closed or not (chan.get_transport() and chan.get_transport().is_active())):
                    if chan.eof_received and chan.status_event.is_set():
                        continue  # it finished and closed between our checks: drain it above
                    # close() from another thread, or the server dropped the connection or the channel
                    raise EOFError("the SSH connection was closed" if not chan.closed else
                                   "the server closed the channel without an exit status"
                                   + ("" if chan.get_transport() and chan.get_transport().is_active()
                                      else " and the connection"))
                if not got:
                    _wait_readable(chan, 0.02)
            code = chan.recv_exit_status()
        except socket.timeout:
            _traced(self.name, shown, None, deadline - timeout)
            raise CommandFailed(self.name, shown, None, out.decode(errors="replace")[-2000:]) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self._drop(conn)
            raise ConnectionLost(self.name, f"connection lost while running `{shown}`: {exc}") from None
        finally:
            chan.close()
        _traced(self.name, shown, code, deadline - timeout)
        res = Result(self.name, shown, code, out.decode(errors="replace"), err.decode(errors="replace"))
        if check and not res.ok:
            raise CommandFailed(self.name, shown, code, (res.stderr or res.stdout)[-2000:])
        return res

    def stream_out(self, argv: Argv, chunk: int = STREAM_CHUNK) -> Iterable[bytes]:
        """Yield a command's stdout as it arrives (e.g. `tar -c` to pipe into another host);
        raise CommandFailed at the end if it exited non-zero."""
        cmd = shlex.join(argv)
        chan = self.conn.transport.open_session(timeout=self.settings.connect_timeout)
        try:
            chan.settimeout(self.settings.command_timeout)
            chan.exec_command(cmd)
            chan.shutdown_write()
            while True:
                data = chan.recv(chunk)
                if not data:
                    break
                yield data
            err = b""
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            code = chan.recv_exit_status()
            if code != 0:
                raise CommandFailed(self.name, cmd, code, err.decode(errors="replace")[-2000:])
        except socket.timeout:
            raise CommandFailed(self.name, cmd, None) from None
        finally:
            chan.close()

    def stream_lines(self, argv: Argv, on_line: Callable[[str], None], *,
                     stop: threading.Event | None = None) -> int:
        """Run a command and hand each line of its output (stdout and stderr) to ``on_line`` as it
        arrives, until it exits or ``stop`` is set. Returns the exit code (-1 when stopped)."""
        chan = self.conn.transport.open_session(timeout=self.settings.connect_timeout)
        chan.set_combine_stderr(True)
        try:
            chan.exec_command(shlex.join(argv))
            chan.shutdown_write()
            buf = b""
            while not (stop and stop.is_set()):
                if chan.recv_ready():
                    data = chan.recv(65536)
                    if not data:
                        break
                    buf += data
                    *lines, buf = buf.split(b"\n")
                    for ln in lines:
                        on_line(ln.decode(errors="replace"))
                elif chan.exit_status_ready() and not chan.recv_ready():
                    break
                else:
                    _wait_readable(chan, 0.2)
            if buf:
                on_line(buf.decode(errors="replace"))
            return chan.recv_exit_status() if not (stop and stop.is_set()) else -1
        finally:
            chan.close()

    def acquire_lock(self, path: str, holder: str, *, wait: float = 0.0,
                     on_wait: Callable[[str], None] | None = None) -> "HeldLock":
        """Take an exclusive lock on this host (flock on ``path``), held until release() or until
        this process ends (the remote holder exits when our channel closes, even after a crash).

        Raises :class:`LockBusy` naming the holder when it is not free within ``wait`` seconds.
        When the connection drops while the lock is held, the next command's connection takes it
        again first (:meth:`_retake`), or fails with :class:`LockLost`.
        """
        chan = self._take(self.conn, path, holder, wait=wait, on_wait=on_wait)
        with self._lock:
            self._held[path] = (holder, chan)
        return HeldLock(self, path)

    def release_lock(self, path: str) -> None:
        """Release it (a second call does nothing). Should closing its channel fail, the connection
        is closed instead: the lock goes with it."""
        with self._lock:
            _, chan = self._held.pop(path, (None, None))
        if chan is not None:
            try:
                chan.close()
            except Exception:  # noqa: BLE001 - a transport torn down under us (see close)
                self.close()

    def _take(self, conn: Connection, path: str, holder: str, *, wait: float = 0.0,
              on_wait: Callable[[str], None] | None = None) -> paramiko.Channel:
        chan = conn.transport.open_session(timeout=self.settings.connect_timeout)
        chan.exec_command(shlex.join(("sh", "-c", _LOCK, "bootstrap-lock", path, f"{max(0.0, wait):g}", holder)))
        deadline = time.monotonic() + max(0.0, wait) + self.settings.connect_timeout + 10
        buf, holder_seen = b"", ""
        try:
            while True:
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    word = line.decode(errors="replace").strip()
                    if word == "LOCKED":
                        return chan
                    if word == "WAITING":
                        continue
                    if word in ("NOFLOCK", "NOFILE"):
                        raise CommandFailed(self.name, f"lock {path}", None,
                                            hint="flock (util-linux) is needed on the head host" if word == "NOFLOCK"
                                            else f"cannot open {path}")
                    holder_seen = holder_seen or word
                    if on_wait and wait > 0 and holder_seen == word:
                        on_wait(word)
                if chan.exit_status_ready() and not chan.recv_ready():
                    raise LockBusy(self.name, path, holder_seen, wait)
                if time.monotonic() > deadline:
                    raise LockBusy(self.name, path, holder_seen, wait)
                r = _wait_readable(chan, 0.2)
                if r or chan.recv_ready():
                    data = chan.recv(4096)
                    if not data and chan.exit_status_ready():
                        raise LockBusy(self.name, path, holder_seen, wait)
                    buf += data
        except BaseException:
            chan.close()
            raise

    def http_get(self, ip: str, port: int, path: str, *, timeout: float = 10.0) -> tuple[int, bytes]:
        """GET http://ip:port/path as seen from this host, through an SSH direct-tcpip channel (what
        `ssh -L` does): services bound to a data-plane IP this machine may not reach, no curl needed
        on the host. OSError when the service refuses or does not answer."""
        import http.client

        ssh = self.conn
        try:
            chan = ssh.transport.open_channel("direct-tcpip", (ip, port), ("127.0.0.1", 0), timeout=timeout)
        except paramiko.ChannelException as exc:
            raise ConnectionRefusedError(f"{ip}:{port} from {self.name}: {exc.text or 'connect failed'}") from None
        except (EOFError, paramiko.SSHException) as exc:
            self._drop(ssh)
            raise HostUnreachable(self.name, f"connection lost before GET {path}: {exc}") from None
        conn = http.client.HTTPConnection(ip, port, timeout=timeout)
        try:
            chan.settimeout(timeout)
            conn.sock = chan  # a socket to http.client: sendall, makefile, close
            conn.request("GET", path, headers={"Accept": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        except (http.client.HTTPException, socket.timeout) as exc:
            raise OSError(f"GET http://{ip}:{port}{path} from {self.name}: {exc or type(exc).__name__}") from None
        finally:
            conn.close()
            chan.close()


class HeldLock:
    def __init__(self, ssh: SSHHost, path: str) -> None:
        self.host, self.path, self._ssh = ssh.name, path, ssh

    def release(self) -> None:
        self._ssh.release_lock(self.path)


_HOST_KEYS: dict[tuple[str, int, int], paramiko.HostKeys] = {}
_HOST_KEYS_LOCK = threading.Lock()


def _parsed_host_keys(path: Path) -> paramiko.HostKeys:
    """A known_hosts file parsed once per version (path, mtime, size) and shared by every
    connection: parsing it per connection costs O(hosts x lines) CPU, ~0.4 s at 64 hosts."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _HOST_KEYS_LOCK:
        hk = _HOST_KEYS.get(key)
        if hk is None:
            hk = _HOST_KEYS[key] = paramiko.HostKeys(str(path))
        return hk


def _wait_readable(chan: paramiko.Channel, timeout: float) -> bool:
    """Wait until the channel has data (or timeout). poll(), not select(): select() refuses file
    descriptors >= 1024, which a controller holding hundreds of connections reaches."""
    p = select.poll()
    p.register(chan.fileno(), select.POLLIN)
    return bool(p.poll(timeout * 1000))


def _transient(exc: BaseException) -> bool:
    """Worth another connect attempt: refused/reset/closed early (sshd restarting or over its
    MaxStartups), not a timeout or a missing route (the host is down: retrying only adds waits)."""
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return False
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
        return False
    if isinstance(exc, socket.gaierror):
        return False
    return True


# `sh -c _HANGUP sh CMD...`: run CMD with stdin from /dev/null while a watcher reads the channel's
# stdin (saved as fd 3); when the channel closes the watcher sees EOF and terminates CMD.
_HANGUP = ('exec 3<&0; "$@" 3<&- </dev/null & c=$!; '
           '{ cat <&3 >/dev/null 2>&1; kill -TERM "$c" 2>/dev/null; } >/dev/null 2>&1 & w=$!; '
           'exec 3<&-; wait "$c"; rc=$?; kill "$w" 2>/dev/null; exit "$rc"')

# Held while the channel stays open: flock on fd 9 (util-linux), the holder written into the
# file (world-readable; only the owner writes). Prints LOCKED, or BUSY and the holder, exit 75.
_LOCK = ('command -v flock >/dev/null 2>&1 || { echo NOFLOCK; exit 71; }; f="$1"; '
         '[ -e "$f" ] || (umask 022; : >>"$f") 2>/dev/null; exec 9<"$f" || { echo NOFILE; exit 70; }; '
         'if ! flock -n 9; then echo WAITING; cat "$f"; flock -w "$2" 9 || exit 75; fi; '
         '[ -O "$f" ] && printf "%s\\n" "$3" >"$f"; echo LOCKED; exec cat >/dev/null 2>&1')


def stream_file(fh: BinaryIO, chunk: int = STREAM_CHUNK) -> Iterable[bytes]:
    while True:
        data = fh.read(chunk)
        if not data:
            return
        yield data
