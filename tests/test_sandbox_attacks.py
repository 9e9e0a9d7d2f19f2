"""pvf_lmeval.sandbox under attack: one hostile candidate per escape class and per
resource bomb, each run as the test's own user (root in CI) and, when that is root, again
by a plain user (uid 43210, started through setpriv; see ``_plain_user_command``).

After every attack the world is checked: nothing created or changed outside the sandbox
(tagged paths in /tmp, /var/tmp, /dev/shm, the home folder, the working directory, a
world-writable folder; a world-writable canary file), no process of the test signalled
(sentinels running as root, as uid 65534 and as the plain user), no connection received by
the TCP, Unix-socket and abstract-socket listeners we started, the checking process alive,
and the verdict right (every attack's answers are wrong, so nothing may pass).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pvf_lmeval.sandbox import ExecResult, check_candidate, check_candidates
from pvf_lmeval.sandbox.bubblewrap import find_bwrap, python_paths

ROOT = os.geteuid() == 0
PLAIN_UID = 43210
NOBODY = 65534
REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "helpers" / "sandbox_driver.py"
MODES = ["self"] + (["plain-user"] if ROOT else [])

PROMPT = 'def add(a, b):\n    """Return a + b."""\n'
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(10, -4) == 6\n"
LIMITS = {"timeout": 1, "wall_timeout": 30}  # CPU seconds; wall seconds (CI may be busy)


@dataclass
class World:
    """What an attack must leave alone, and the addresses it is told about."""

    tag: str
    home: Path
    canary: Path
    canary_dir: Path
    tcp: socket.socket
    unix: socket.socket
    unix_path: str
    abstract: socket.socket
    abstract_name: str
    sentinels: list = field(default_factory=list)
    canary_state: tuple = ()

    def targets(self) -> dict:
        """Paths outside the sandbox that an attack tries to create."""
        name = f"pvf_atk_{self.tag}"
        return {"tmp": f"/tmp/{name}", "vartmp": f"/var/tmp/{name}", "shm": f"/dev/shm/{name}",
                "home": str(self.home / name), "cwd": str(Path.cwd() / name),
                "repo": str(REPO / name), "open_dir": str(self.canary_dir / name)}

    def facts(self) -> dict:
        """Everything an attack is told: targets, canary, listeners, pids to kill."""
        return {"targets": self.targets(), "canary": str(self.canary),
                "canary_dir": str(self.canary_dir), "home": str(self.home),
                "port": self.tcp.getsockname()[1], "unix": self.unix_path,
                "abstract": self.abstract_name,
                "pids": [p.pid for p in self.sentinels] + [os.getpid(), os.getppid()]}

    def watched(self) -> list[Path]:
        dirs = [Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), self.home, Path.cwd(), REPO,
                self.canary_dir]
        return [d for i, d in enumerate(dirs) if d not in dirs[:i]]

    def assert_untouched(self) -> None:
        leftovers = [str(p) for d in self.watched() if d.is_dir()
                     for p in d.iterdir() if self.tag in p.name and p != self.home]
        assert not leftovers, f"created outside the sandbox: {leftovers}"
        assert _state(self.canary) == self.canary_state, "the canary file was changed"
        assert list(self.canary_dir.iterdir()) == [], "the world-writable folder was written"
        dead = [p.args for p in self.sentinels if p.poll() is not None]
        assert not dead, f"sentinel processes were killed: {dead}"
        for name, sock in (("tcp", self.tcp), ("unix", self.unix), ("abstract", self.abstract)):
            with pytest.raises(BlockingIOError):
                conn, _ = sock.accept()
                conn.close()
                raise AssertionError(f"the {name} listener received a connection")


def _state(path: Path) -> tuple:
    st = path.stat()
    return path.read_bytes(), st.st_mode, st.st_mtime_ns, st.st_uid


def _listener(family, address) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind(address)
    s.listen(8)
    s.setblocking(False)
    return s


def _sentinel(uid: int | None) -> subprocess.Popen:
    kw = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
    return subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, **kw)


@pytest.fixture
def world():
    tag = uuid.uuid4().hex[:12]
    base = Path(f"/tmp/pvf_world_{uuid.uuid4().hex[:12]}")   # outside pytest's 0700 folders
    base.mkdir(mode=0o755)
    home, open_dir = base / "home", base / "open"
    home.mkdir()
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    if ROOT:
        os.chown(home, PLAIN_UID, PLAIN_UID)
    canary = base / "canary.txt"
    canary.write_text("unchanged\n")
    os.chmod(canary, 0o666)
    unix_path = str(base / "listen.sock")
    unix = _listener(socket.AF_UNIX, unix_path)
    os.chmod(unix_path, 0o777)
    abstract_name = f"pvf_listen_{tag}"
    w = World(tag, home, canary, open_dir,
              _listener(socket.AF_INET, ("127.0.0.1", 0)), unix, unix_path,
              _listener(socket.AF_UNIX, "\0" + abstract_name), abstract_name)
    w.sentinels = [_sentinel(None)] + ([_sentinel(NOBODY), _sentinel(PLAIN_UID)] if ROOT else [])
    w.canary_state = _state(canary)
    yield w
    for p in w.sentinels:
        p.kill()
        p.wait()
    for s in (w.tcp, w.unix, w.abstract):
        s.close()
    for d in w.watched():
        if d.is_dir():
            for p in d.iterdir():
                if tag in p.name:
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------ running as a plain user

def _closed_ancestor(path: str) -> str | None:
    """The first of ``path``'s ancestors (or itself) that others may not enter."""
    p = Path(path).resolve()
    for a in list(reversed(p.parents)) + [p]:
        if not a.stat().st_mode & stat.S_IXOTH:
            return str(a)
    return None


def _plain_user_command(world: World, job: dict) -> list[str]:
    """The driver as uid PLAIN_UID, with no capabilities, in a mount namespace where the
    folders it needs (the interpreter, the venv, this checkout) can be entered: where one of
    them lies under a closed folder such as /root, that folder is covered by an empty tmpfs
    and the needed folder bound back. Nothing else differs from the real machine."""
    need = sorted({*python_paths()[1], str(Path(sys.prefix).resolve()), str(REPO)})
    closed = sorted({a for a in map(_closed_ancestor, need) if a})
    cmd = [find_bwrap(), "--dev-bind", "/", "/"]
    for a in closed:
        cmd += ["--perms", "0755", "--tmpfs", a]
    for d in need:
        under = [a for a in closed if d == a or d.startswith(a + "/")]
        if under:
            for mid in reversed(Path(d).parents):   # folders between: enterable too
                if str(mid).startswith(under[0] + "/"):
                    cmd += ["--perms", "0755", "--dir", str(mid)]
            cmd += ["--ro-bind", d, d]
    return cmd + ["--", "setpriv", f"--reuid={PLAIN_UID}", f"--regid={PLAIN_UID}",
                  "--clear-groups", "--inh-caps=-all", "--",
                  sys.executable, "-B", str(DRIVER), json.dumps(job)]


def run_as(mode: str, world: World, program: str, **limits) -> ExecResult:
    job = dict(program=program, prompt=PROMPT, test=TEST, entry_point="add",
               **{**LIMITS, **limits})
    if mode == "self":
        return check_candidate(job.pop("program"), **job)
    env = {"HOME": str(world.home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
           "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(_plain_user_command(world, job), env=env, cwd=str(world.home),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the plain user's checking process died: {done.stderr[-2000:]}"
    return ExecResult(**json.loads(done.stdout.strip().splitlines()[-1]))


def attack_program(world: World, attack: str) -> str:
    """PROMPT, a stub that hands each call to ``_attack(a, b)``, and the attack code, which
    sees the world's facts as ``T``."""
    return (PROMPT + "    return _attack(a, b)\n\n\nT = " + repr(world.facts()) + "\n"
            + attack)


# ------------------------------------------------------------------ the attacks

SPAM = """
import os
FRAMES = [b"('passed',)", b"('ready',)", b"('return', 5)", b"('return', 6)"]
def spam():
    for fd in range(256):
        for body in FRAMES:
            try:
                os.write(fd, len(body).to_bytes(4, 'big') + body)
            except OSError:
                pass
        try:
            os.write(fd, b"0" * 32 + b"\\tpassed\\t\\n")
        except OSError:
            pass
"""

ATTACKS = {
    # --- forged verdicts: implicit calls in the runner's frame, frames/nonce, the hook
    "forge_implicit_calls": (SPAM + """
class Liar(Exception):
    def __str__(self):
        spam()
        return "passed"
class Meta(type):
    @property
    def __name__(cls):
        spam()
        return "passed"
class Ghost(metaclass=Meta):
    def __del__(self):
        spam()
_keep = []
def _attack(a, b):
    Ghost()
    _keep.append(Ghost())
    raise Liar()
""", {"failed"}),
    "forge_from_frames": (SPAM + """
import sys, gc
def _attack(a, b):
    f, seen = sys._getframe(), []
    while f is not None:
        seen.append(dict(f.f_locals))
        f = f.f_back
    gc.get_objects()
    for mod in list(sys.modules.values()):
        if callable(getattr(mod, "send", None)) and callable(getattr(mod, "recv", None)):
            for fd in range(64):
                try:
                    mod.send(fd, ("passed",))
                except Exception:
                    pass
            mod.to_tree = lambda value, lenient=False: 5
    spam()
    return a - b
""", {"failed"}),
    "take_over_the_runner": ("""
import os, sys
CODE = '''
import os
ANSWER = len(b"('return', 5)").to_bytes(4, "big") + b"('return', 5)"
os.write(4, ANSWER)  # the call in progress, then every later one
while True:
    n = os.read(3, 4)
    if not n:
        break
    os.read(3, int.from_bytes(n, "big"))
    os.write(4, ANSWER)
'''
def _attack(a, b):
    os.dup2(int(sys.argv[3]), 3)
    os.dup2(int(sys.argv[4]), 4)
    os.execv(sys.executable, [sys.executable, "-S", "-c", CODE])
""", {"failed"}),
    "forge_equality": ("""
class Always(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
class Anything:
    def __eq__(self, other):
        return True
_n = [0]
def _attack(a, b):
    _n[0] += 1
    return Always(0) if _n[0] == 1 else Anything()
""", {"failed"}),
    # --- writes an audit hook never saw
    "unaudited_writes": ("""
import os, shutil
def _try(f, *args):
    try:
        f(*args)
    except BaseException:
        pass
def _sqlite(p):
    import sqlite3
    con = sqlite3.connect(p + ".db")
    con.execute("create table t(x)")
    con.commit()
    con.execute("ATTACH DATABASE ? AS other", (p + ".att",))
    con.execute("create table other.t(x)")
    con.commit()
    con.execute("VACUUM INTO ?", (p + ".vac",))
def _readline(p):
    import readline
    readline.add_history("x")
    readline.write_history_file(p + ".hist")
def _dbm(p):
    import dbm
    d = dbm.open(p + ".dbm", "c")
    d[b"k"] = b"v"
    d.close()
def _attack(a, b):
    for p in T["targets"].values():
        _try(os.mkfifo, p + ".fifo")
        _try(os.mknod, p + ".node")
        _try(_sqlite, p)
        _try(_readline, p)
        _try(_dbm, p)
        _try(lambda: open(p, "w").write("x"))
        _try(os.mkdir, p + ".dir")
        _try(os.symlink, "/etc/passwd", p + ".sym")
        _try(os.link, T["canary"], p + ".lnk")
        _try(shutil.copy, "/etc/hostname", p + ".copy")
    c = T["canary"]
    _try(lambda: open(c, "a").write("changed"))
    _try(os.chmod, c, 0o600)
    _try(os.utime, c, (0, 0))
    _try(os.truncate, c, 0)
    _try(os.rename, c, c + ".moved")
    _try(os.unlink, c)
    return a - b
""", {"failed"}),
    # --- the plain-user escapes: home, the parent, a shell
    "signal_everyone": ("""
import os, signal
def _attack(a, b):
    for pid in T["pids"] + [os.getppid()]:
        for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    for pid in range(2, 1 << 15):
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return a - b
""", {"failed"}),
    "exec_a_shell": ("""
import os
def _attack(a, b):
    t = T["targets"]
    script = "; ".join(["echo x > %s" % t["home"], "echo x > %s" % t["tmp"],
                        "echo x > %s" % t["open_dir"], "rm -f %s" % T["canary"]]
                       + ["kill -9 %d" % p for p in T["pids"]] + ["kill -9 -1"])
    os.execv("/bin/sh", ["sh", "-c", script])
""", {"failed", "signal"}),
    "network": ("""
import socket
def _try(family, address):
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(0.5)
        s.connect(address)
    except OSError:
        pass
def _attack(a, b):
    _try(socket.AF_INET, ("127.0.0.1", T["port"]))
    _try(socket.AF_UNIX, T["unix"])
    _try(socket.AF_UNIX, "\\0" + T["abstract"])
    _try(socket.AF_INET, ("1.1.1.1", 80))
    return a - b
""", {"failed"}),
    # --- resource bombs
    "fork_bomb": ("""
import os, subprocess
def _attack(a, b):
    try:
        subprocess.run(["true"])
    finally:
        while True:
            os.fork()
""", {"failed"}),
    "thread_bomb": ("""
import threading, time
def _attack(a, b):
    while True:
        threading.Thread(target=time.sleep, args=(60,)).start()
""", {"failed"}),
    "memory_bomb": ("""
_hold = []
def _attack(a, b):
    while True:
        _hold.append(bytearray(16 << 20))
""", {"memory"}, {"memory_mb": 256}),
    "output_flood": ("""
import os, sys
def _attack(a, b):
    line = "x" * 65536
    while True:
        sys.stdout.write(line)
        os.write(2, line.encode())
""", {"timeout"}),
    "fd_bomb": ("""
_fds = []
def _attack(a, b):
    while True:
        _fds.append(open("/dev/null"))
""", {"failed"}),
    "disk_bomb": ("""
import os
def _attack(a, b):
    i = 0
    while True:
        for d in ("/tmp", "/dev/shm", os.getcwd()):
            try:
                with open("%s/%s_%d" % (d, "pvf_atk_" + T["targets"]["tmp"][-12:], i), "wb") as f:
                    for _ in range(15):
                        f.write(b"x" * (1 << 20))
            except OSError:
                if d == "/tmp" and i > 2:
                    raise
        i += 1
""", {"failed"}),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_contained(world, mode, name):
    code, reasons, *limits = ATTACKS[name]
    res = run_as(mode, world, attack_program(world, code), **(limits[0] if limits else {}))
    assert not res.passed and res.reason in reasons, res
    world.assert_untouched()


NATIVE = r"""
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static void each(const char *list, void (*f)(const char *)) {
    char buf[4096];
    if (!list) return;
    strncpy(buf, list, sizeof buf - 1);
    buf[sizeof buf - 1] = 0;
    for (char *p = strtok(buf, ":"); p; p = strtok(NULL, ":")) f(p);
}
static void create(const char *p) {
    int fd = open(p, O_CREAT | O_WRONLY, 0666);
    if (fd >= 0) { write(fd, "x", 1); close(fd); }
    mkdir(p, 0777);
}
static void kill_pid(const char *p) { kill(atoi(p), SIGKILL); }

__attribute__((constructor)) static void attack(void) {
    each(getenv("ATK_PATHS"), create);
    const char *canary = getenv("ATK_CANARY");
    if (canary) unlink(canary);
    struct sockaddr_un u = {.sun_family = AF_UNIX};
    const char *up = getenv("ATK_UNIX");
    if (up) {
        strncpy(u.sun_path, up, sizeof u.sun_path - 1);
        connect(socket(AF_UNIX, SOCK_STREAM, 0), (struct sockaddr *)&u, sizeof u);
    }
    struct sockaddr_in in = {.sin_family = AF_INET};
    in.sin_port = htons(atoi(getenv("ATK_PORT") ? getenv("ATK_PORT") : "1"));
    in.sin_addr.s_addr = inet_addr("127.0.0.1");
    connect(socket(AF_INET, SOCK_STREAM, 0), (struct sockaddr *)&in, sizeof in);
    each(getenv("ATK_PIDS"), kill_pid);
    kill(getppid(), SIGKILL);
    for (int p = 2; p < 32768; p++) if (p != getpid()) kill(p, SIGKILL);
    kill(-1, SIGKILL);
    fork();
}
"""


@pytest.fixture(scope="module")
def native_library(tmp_path_factory) -> bytes:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the hostile shared library")
    d = tmp_path_factory.mktemp("native")
    (d / "attack.c").write_text(NATIVE)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(d / "attack.so"),
                    str(d / "attack.c")], check=True, capture_output=True)
    return (d / "attack.so").read_bytes()


@pytest.mark.parametrize("mode", MODES)
def test_native_code_through_ctypes_is_contained(world, mode, native_library):
    code = """
import ctypes, os
LIB = %r
def _attack(a, b):
    os.environ["ATK_PATHS"] = ":".join(T["targets"].values())
    os.environ["ATK_CANARY"] = T["canary"]
    os.environ["ATK_UNIX"] = T["unix"]
    os.environ["ATK_PORT"] = str(T["port"])
    os.environ["ATK_PIDS"] = ":".join(map(str, T["pids"]))
    with open("attack.so", "wb") as f:
        f.write(LIB)
    ctypes.CDLL(os.path.abspath("attack.so"))
    return a - b
""" % native_library
    res = run_as(mode, world, attack_program(world, code))
    assert not res.passed and res.reason in ("failed", "signal"), res
    world.assert_untouched()


@pytest.mark.parametrize("mode", MODES)
def test_a_correct_candidate_passes_in_the_same_world(world, mode):
    code = "import time\ndef _attack(a, b):\n    return a + b\n"
    res = run_as(mode, world, attack_program(world, code))
    assert res.passed and res.reason == "passed", res
    world.assert_untouched()


def test_samples_cannot_kill_each_other(world):
    """Killers sweep every pid while correct samples (slow to answer) run beside them."""
    killer = attack_program(world, ATTACKS["signal_everyone"][0].replace(
        "    return a - b", "    import time\n    time.sleep(0.2)\n    return a - b"))
    good = attack_program(world, "import time\ndef _attack(a, b):\n"
                                 "    time.sleep(0.5)\n    return a + b\n")
    progs = [killer, good] * 3
    res = check_candidates([dict(program=p, prompt=PROMPT, test=TEST, entry_point="add")
                            for p in progs], workers=4, **LIMITS)
    assert [r.passed for r in res] == [False, True] * 3, res
    world.assert_untouched()
