"""A real Slurm cluster, brought up by the tests themselves: one controller and two nodes.

``slurmctld`` runs in the machine's own (root) network namespace; each of the two ``slurmd``
nodes runs in a network namespace of its own and a hostname (UTS) namespace of its own, so
that a job's ``hostname`` and the addresses its processes see are the node's. The nodes are
wired by veth pairs to a Linux bridge in the root namespace, which carries the controller's
address in a private /24 (10.214.R.1, R random); the nodes are .2 and .3::

    root namespace                                      node1's namespaces   node2's namespaces
    slurmctld (its hostname ctl-XXXX in a UTS namespace), orch master, a notebook kernel ...
    bridge osl-XXXX 10.214.R.1 ──┬── veth osl-XXXX-1 ── eth0 10.214.R.2
                                 └── veth osl-XXXX-2 ─────────────────────── eth0 10.214.R.3
                                                        hostname node1-XXXX  hostname node2-XXXX
                                                        slurmd, its jobs     slurmd, its jobs

So a notebook kernel or ``orch master`` in the root namespace binds to ``controller_ip`` and
the jobs' processes reach it; all the traffic stays on the bridge (and loopback). The only
changes outside the cluster's own temporary folder are the bridge (with its veths and the
two namespaces) and three lines of ``/etc/hosts``; all are removed at teardown, with every
process the cluster started. Its ``munged`` is its own too (own key and socket, in that
folder), so a machine's munged, if it has one, is neither needed nor touched.

``slurm_cluster`` is a session-scoped pytest fixture (the cluster takes a few seconds to come
up); ``start_cluster()`` is the context manager it wraps. Client commands find the cluster
through ``SLURM_CONF`` (``cluster.env`` / ``cluster.environ(base)``); nothing is written to
/etc/slurm. A job submitted from a test inherits the test's environment (sbatch exports it),
so its processes carry the test's ``ORCH_TEST_TAG`` and tests/conftest.py checks that none
outlives the test; the daemons are started without it.

Needs root, iproute2, util-linux (nsenter, unshare), Debian's ``slurm-wlm`` and ``munge``;
without them the tests that use the cluster are skipped, saying why, and under CI (``CI`` set:
.ci/run installs them) they fail instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn

import psutil
import pytest

# A node's state in sinfo once it registered and can take jobs.
READY = "idle"
# How long the daemons get to register, and to stop on SIGTERM.
START_TIMEOUT = 60.0
STOP_GRACE = 5.0
# Job states after which nothing of the job runs any more (squeue's %T); any other is live.
ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "TIMEOUT",
    }
)
# squeue -o: job id, state, reason, nodes, name ("|" appears in none of the first four).
SQUEUE_FORMAT = "%i|%T|%r|%N|%j"
SQUEUE_FIELDS = ("job_id", "state", "reason", "nodes", "name")

# The commands the cluster is made with.
NEEDED = ("ip", "nsenter", "unshare", "hostname", "munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scancel", "scontrol")

# Where Debian puts the daemons, also when PATH lacks them (a non-login root shell's may).
SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")

# Become the hostname $0 in the UTS namespace `unshare --uts` made, then the command (same pid).
SET_HOSTNAME = 'hostname "$0" && exec "$@"'


def _as_host(hostname: str, *argv: str) -> list[str]:
    """``argv`` run under its own hostname (a new UTS namespace); the same process, exec'd."""
    return ["unshare", "--uts", "sh", "-c", SET_HOSTNAME, hostname, *argv]


def unavailable(reason: str) -> NoReturn:
    """Skip, saying why; under CI, which must run these tests, fail with the same reason."""
    # tests/launchers/test_multihost.py's pattern (copied: test modules import nothing from each other).
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: these tests must run there, not skip)", pytrace=False)
    pytest.skip(reason)


def alive(pid: int) -> bool:
    """True while process ``pid`` runs (a zombie has ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _ip(*args: str) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _tail(path: Path, lines: int) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def daemon_environ() -> dict[str, str]:
    """The daemons' environment: ours without the test's tag (tests/conftest.py fails a test
    that leaves a tagged process behind, and the daemons outlive every test), and without any
    Slurm variables of an allocation this suite may itself run in."""
    return {k: v for k, v in os.environ.items() if k != "ORCH_TEST_TAG" and not k.startswith("SLURM_")}


@dataclass(frozen=True)
class SlurmNode:
    name: str  # Slurm's node name, and the hostname in its UTS namespace
    ns: str  # its network namespace, /run/netns/<ns>
    ip: str  # its address on the bridge


@dataclass
class SlurmCluster:
    """A running cluster: where it lives, its nodes, and helpers to drive it."""

    suffix: str  # in every name the cluster gives (its nodes, namespaces, bridge), against clashes
    dir: Path  # slurm.conf, state, spool dirs, logs, pid files, munge's key and socket
    conf: Path
    controller: str  # slurmctld's host name (in /etc/hosts, at controller_ip)
    controller_ip: str  # the bridge's address: where a master in the root namespace binds
    nodes: list[SlurmNode]
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # name -> daemon

    @property
    def env(self) -> dict[str, str]:
        """The variables a Slurm client command needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with this cluster's variables, and
        without the Slurm variables of any other allocation (which would mislead the clients)."""
        base = os.environ if base is None else base
        return {**{k: v for k, v in base.items() if not k.startswith("SLURM_")}, **self.env}

    def node(self, name: str) -> SlurmNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} in this cluster (its nodes: {self.node_names})")

    def run(
        self,
        *argv: str,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        timeout: float = 60,
        **kw: Any,
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (``run("sinfo", "-N")``) run to completion against this
        cluster, its output captured as text; ``env`` is the base environment (default ours).
        With ``check``, a non-zero exit raises, with what the command said."""
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, env=self.environ(env), timeout=timeout, **kw
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"`{' '.join(argv)}` exited {proc.returncode}:\n{proc.stdout}{proc.stderr}".rstrip()
            )
        return proc

    def sbatch(self, *args: str, env: Mapping[str, str] | None = None) -> int:
        """Submit a batch job (``sbatch --parsable *args``); its job id. sbatch exports the
        submitting environment (``env``, default ours) to the job."""
        out = self.run("sbatch", "--parsable", *args, env=env).stdout
        return int(out.strip().split(";")[0])

    def squeue(self, job_id: int | None = None, states: str = "all") -> list[dict[str, str]]:
        """The jobs squeue knows (in any state, unless ``states`` says which), or only
        ``job_id``'s: one dict per job with job_id, state, reason, nodes and name. An ended
        job is forgotten MinJobAge seconds after it ended: then it is not listed."""
        argv = ["squeue", "-h", "-o", SQUEUE_FORMAT, f"--states={states}"]
        if job_id is not None:
            argv += ["-j", str(job_id)]
        proc = self.run(*argv, check=job_id is None)
        if proc.returncode != 0:  # squeue -j of a job already forgotten: "Invalid job id"
            if "Invalid job id" in proc.stderr:
                return []
            raise RuntimeError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
        return [
            dict(zip(SQUEUE_FIELDS, line.split("|", 4), strict=True))
            for line in proc.stdout.splitlines()
            if line
        ]

    def wait_job(self, job_id: int, timeout: float = 60) -> dict[str, str]:
        """Waits until job ``job_id`` has ended; its last record (state ``GONE`` if squeue
        already forgot it). Raises after ``timeout`` seconds, with the job's record."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.squeue(job_id)
            if not found:  # forgotten: it ended at least MinJobAge ago
                return dict(zip(SQUEUE_FIELDS, (str(job_id), "GONE", "", "", ""), strict=True))
            record = found[0]
            if record["state"] in ENDED_STATES:
                return record
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still live after {timeout}s: {record}")
            time.sleep(0.1)

    def node_pids(self, name: str, *, daemon: bool = False) -> list[int]:
        """Live processes in node ``name``'s network namespace: its jobs' (slurmstepd, the
        tasks), without the node's slurmd unless ``daemon``."""
        slurmd = self.daemons[name].pid
        pids = [int(word) for word in _ip("netns", "pids", self.node(name).ns).split()]
        return [p for p in pids if alive(p) and (daemon or p != slurmd)]

    def log_tail(self, daemon: str, lines: int = 30) -> str:
        """The end of a daemon's log and of what it printed: ``slurmctld``, ``munged``, or a
        node's name (its slurmd)."""
        if daemon not in self.daemons:
            raise KeyError(f"no daemon {daemon!r} (the cluster's: {sorted(self.daemons)})")
        # The daemon's own log file (none for munged, which logs to stderr in the foreground)
        # and what it printed: its earliest errors come before it opens its log file.
        paths = [self.dir / "log" / f"{daemon}.log", self.dir / "log" / f"{daemon}.out"]
        return "\n".join(f"== {p}\n{_tail(p, lines)}" for p in paths if p.exists())

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(self.log_tail(d, lines) for d in self.daemons)


def _slurm_conf(c: SlurmCluster, port: int, munge_socket: Path) -> str:
    d = c.dir
    node_lines = [
        # More CPUs than the machine's cores (2): SlurmdParameters=config_overrides makes slurmd
        # take the declared count, so that 4 single-CPU tasks and two jobs at once fit.
        f"NodeName={n.name} NodeAddr={n.ip} CPUs=8 State=UNKNOWN"
        for n in c.nodes
    ]
    lines = [
        f"ClusterName=orch{c.suffix}",
        # slurmctld checks that it runs on the host named here: it gets that hostname in a UTS
        # namespace of its own (see start_cluster), and /etc/hosts says where the name is.
        f"SlurmctldHost={c.controller}({c.controller_ip})",
        # Bind slurmctld to the controller's address only (the bridge), not to every address
        # of the machine, and on a port free there, so that no other slurmctld is in the way.
        "CommunicationParameters=NoCtldInAddrAny",
        f"SlurmctldPort={port}",
        "SlurmdPort=6818",  # each node has the port to itself, in its own namespace
        "SlurmUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",  # this cluster's own munged
        f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool/%n",  # %n: the node's name, one each
        f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmdPidFile={d}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/%n.log",
        "MailProg=/bin/true",  # else slurmctld complains that there is no mail program
        # Processes are tracked by their parent pids, and no task plugin: the cgroup ones need
        # a cgroup hierarchy this machine (and a container) may not give slurmd.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        # No accounting (so no slurmdbd, and no sacct: tests read squeue and the jobs' output).
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        # Without batch_sched_delay=0 each batch job waits ~3 s before it is scheduled.
        "SchedulerType=sched/backfill",
        "SchedulerParameters=batch_sched_delay=0",
        # Jobs take CPUs, not whole nodes: jobs share nodes.
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",  # a node that went down comes back as soon as it registers
        "KillWait=2",  # scancel's SIGTERM -> SIGKILL gap (default 30 s)
        # An ended job stays in squeue this long (the default is 300 s): long enough for a
        # test to read how it ended (there is no sacct), short enough not to pile up.
        "MinJobAge=30",
        *node_lines,
        f"PartitionName=debug Nodes={','.join(c.node_names)} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def _free_subnet() -> str:
    """10.214.R (R random) where no address or route of the root namespace is."""
    taken = _ip("-4", "route", "show", "table", "all") + _ip("-4", "addr", "show")
    for _ in range(100):
        subnet = f"10.214.{secrets.randbelow(254) + 1}"
        if f"{subnet}." not in taken:
            return subnet
    raise RuntimeError("no free 10.214.R.0/24 subnet: every one tried is in use")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def _hosts_lines(lines: list[str]) -> Iterator[None]:
    """``lines`` appended to /etc/hosts, and exactly those removed again afterwards.

    Without them every lookup of a node's or the controller's name waits ~30 s for a DNS
    server that cannot be reached. The file is rewritten in place (it may be a bind mount),
    under a lock: another session's cluster may be editing it at the same time."""

    def rewrite(edit: Callable[[list[str]], list[str]]) -> None:
        with open("/etc/hosts", "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            text = f.read()
            f.seek(0)
            f.write("".join(f"{line}\n" for line in edit(text.splitlines())))
            f.truncate()

    rewrite(lambda old: old + lines)
    try:
        yield
    finally:
        rewrite(lambda now: [line for line in now if line not in lines])


@contextlib.contextmanager
def _network(suffix: str, names: list[str]) -> Iterator[tuple[str, list[SlurmNode]]]:
    """The bridge (in the root namespace) and one network namespace per node wired to it;
    yields the bridge's address and the nodes. All of it is deleted afterwards."""
    subnet = _free_subnet()
    bridge = f"osl-{suffix}"
    nodes = [
        SlurmNode(name, f"orch-slurm-{suffix}-{i}", f"{subnet}.{i + 1}") for i, name in enumerate(names, 1)
    ]
    with contextlib.ExitStack() as stack:
        probe = subprocess.run(
            ["ip", "link", "add", bridge, "type", "bridge"], capture_output=True, text=True, timeout=30
        )
        if probe.returncode != 0:
            unavailable(
                f"cannot create a bridge: `ip link add {bridge} type bridge` said: {probe.stderr.strip()}"
            )
        stack.callback(subprocess.run, ["ip", "link", "del", bridge], capture_output=True, timeout=30)
        _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, n in enumerate(nodes, 1):
            probe = subprocess.run(["ip", "netns", "add", n.ns], capture_output=True, text=True, timeout=30)
            if probe.returncode != 0:
                unavailable(f"cannot create a network namespace: `ip netns add` said: {probe.stderr.strip()}")
            stack.callback(subprocess.run, ["ip", "netns", "del", n.ns], capture_output=True, timeout=30)
            _ip("-n", n.ns, "link", "set", "lo", "up")
            # The root end joins the bridge; deleting it deletes the pair (a namespace deleted
            # while a process still holds it would keep its end, and so this one, alive).
            veth = f"osl-{suffix}-{i}"
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", n.ns)
            stack.callback(subprocess.run, ["ip", "link", "del", veth], capture_output=True, timeout=30)
            _ip("link", "set", veth, "master", bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", n.ns, "addr", "add", f"{n.ip}/24", "dev", "eth0")
            _ip("-n", n.ns, "link", "set", "eth0", "up")
        yield f"{subnet}.1", nodes


def _stop(daemons: list[subprocess.Popen[bytes]], namespaces: list[str]) -> None:
    """SIGTERM to the daemons, then SIGKILL to whatever of them and of their descendants (found
    through psutil, and in the nodes' namespaces: slurmstepd is not slurmd's child) still runs."""
    found: dict[int, psutil.Process] = {}

    def collect() -> None:
        roots = [d.pid for d in daemons if d.poll() is None]
        for ns in namespaces:
            with contextlib.suppress(RuntimeError):
                roots += [int(w) for w in _ip("netns", "pids", ns).split()]
        for pid in roots:
            with contextlib.suppress(psutil.NoSuchProcess):
                p = psutil.Process(pid)
                found[pid] = p
                for child in p.children(recursive=True):
                    found[child.pid] = child

    collect()
    for d in daemons:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    while any(d.poll() is None for d in daemons) and time.monotonic() < deadline:
        time.sleep(0.05)
    collect()
    for p in found.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    for d in daemons:
        d.wait()
    psutil.wait_procs(list(found.values()), timeout=STOP_GRACE)
    left = [p.pid for p in found.values() if alive(p.pid)]
    if left:
        raise RuntimeError(f"processes of the slurm cluster outlived its teardown: {left}")


def _munge_key(path: Path, uid: int, gid: int) -> None:
    """A new random key (munged refuses a key readable by others, or not its own)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(1024))
    os.chown(path, uid, gid)


def _which(cmd: str) -> str | None:
    return shutil.which(cmd, path=os.pathsep.join([os.environ.get("PATH", os.defpath), *SBIN]))


def _check_prerequisites() -> dict[str, str]:
    """The commands' paths; skips (fails under CI) saying what is missing."""
    if os.geteuid() != 0:
        unavailable(f"needs root for network namespaces and the Slurm daemons; running as uid {os.geteuid()}")
    found = {cmd: _which(cmd) for cmd in (*NEEDED, *CLIENTS)}
    missing = [cmd for cmd, path in found.items() if path is None]
    if missing:
        unavailable(
            f"needs {', '.join(missing)} (Debian: slurm-wlm, munge, iproute2, util-linux), not installed"
        )
    try:
        pwd.getpwnam("munge")
    except KeyError:
        unavailable("needs the `munge` user (Debian's munge package) to run munged as")
    probe = subprocess.run(["unshare", "--uts", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        unavailable(f"cannot create a UTS namespace: `unshare --uts` said: {probe.stderr.strip()}")
    return {cmd: path for cmd, path in found.items() if path is not None}


@contextlib.contextmanager
def start_cluster(lines: int = 40) -> Iterator[SlurmCluster]:
    """Bring a cluster up, yield it once both nodes are idle, take all of it down afterwards.

    Skips (fails under CI) when the machine cannot make one; raises, with the daemons' log
    tails (``lines`` each), when the daemons do not come up within START_TIMEOUT."""
    exe = _check_prerequisites()
    start = time.monotonic()
    suffix = secrets.token_hex(2)
    names = [f"node1-{suffix}", f"node2-{suffix}"]
    with contextlib.ExitStack() as stack:
        d = Path(tempfile.mkdtemp(prefix=f"orch-slurm-{suffix}-"))
        stack.callback(shutil.rmtree, d, ignore_errors=True)
        d.chmod(0o755)  # munged, running as munge, reaches its folder inside
        for sub in ("state", "spool", "log", "run"):
            (d / sub).mkdir()
        munge = pwd.getpwnam("munge")
        munge_dir = d / "munge"
        munge_dir.mkdir(mode=0o755)
        os.chown(munge_dir, munge.pw_uid, munge.pw_gid)

        bridge_ip, nodes = stack.enter_context(_network(suffix, names))
        cluster = SlurmCluster(suffix, d, d / "slurm.conf", f"ctl-{suffix}", bridge_ip, nodes)
        stack.enter_context(
            _hosts_lines(
                [f"{cluster.controller_ip} {cluster.controller}"] + [f"{n.ip} {n.name}" for n in nodes]
            )
        )
        socket_path = munge_dir / "munge.socket"
        _munge_key(munge_dir / "munge.key", munge.pw_uid, munge.pw_gid)
        cluster.conf.write_text(_slurm_conf(cluster, _free_port(cluster.controller_ip), socket_path))

        files: list[IO[bytes]] = []
        stack.callback(lambda: [f.close() for f in files])
        # Registered before any daemon starts: it stops those that did, whatever failed after.
        stack.callback(lambda: _stop(list(cluster.daemons.values()), [n.ns for n in nodes]))
        # At teardown, first of all: cancel the jobs that still run (their processes are then
        # killed with the daemons' anyway, and the namespaces, bridge, hosts lines and folder go).
        stack.callback(_cancel_all, cluster)

        def start_daemon(name: str, argv: list[str], **kw: Any) -> None:
            out = open(d / "log" / f"{name}.out", "wb")  # noqa: SIM115 - closed at teardown
            files.append(out)
            cluster.daemons[name] = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=daemon_environ(), cwd=d, start_new_session=True, **kw,
            )  # fmt: skip

        # munged runs as the munge user, as a packaged one does (it wants its key owned by the
        # user it runs as), in the foreground, so that its pid is the daemon's and it logs to
        # stderr; its own key and socket keep it apart from any munged of the machine.
        start_daemon(
            "munged",
            [
                exe["munged"], "--foreground", f"--socket={socket_path}",
                f"--key-file={munge_dir / 'munge.key'}", f"--pid-file={munge_dir / 'munged.pid'}",
                f"--seed-file={munge_dir / 'munged.seed'}",
            ],
            user=munge.pw_uid, group=munge.pw_gid, extra_groups=[],
        )  # fmt: skip
        _until_up(cluster, lambda: socket_path.exists(), "munged's socket", lines)
        conf = str(cluster.conf)
        # slurmctld stays in the root network namespace; a UTS namespace gives it its hostname.
        start_daemon("slurmctld", _as_host(cluster.controller, exe["slurmctld"], "-D", "-f", conf))
        for n in nodes:
            # nsenter, not `ip netns exec`: that one remounts /sys for the namespace, and slurmd
            # then dies, unable to initialise its cgroup plugin.
            slurmd = _as_host(n.name, exe["slurmd"], "-D", "-N", n.name, "-f", conf)
            start_daemon(n.name, ["nsenter", f"--net=/run/netns/{n.ns}", *slurmd])

        def idle() -> bool:
            proc = cluster.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=30)
            states = dict(line.split() for line in proc.stdout.splitlines() if line.strip())
            return all(states.get(name) == READY for name in names)

        _until_up(cluster, idle, f"both nodes {READY}", lines)
        up = time.monotonic() - start
        # A first job on both nodes, waited for: it proves the whole path (munge credentials,
        # slurmd starting slurmstepd, srun's tasks) before any test relies on it, and takes the
        # controller's first scheduling pass, ~2-3 s after it started, off the tests' clocks;
        # after it, a job starts on slurmctld's next 1-second tick (batch_sched_delay=0).
        warmup = cluster.sbatch("-N", "2", "-o", "/dev/null", "--wrap", "srun true", env=daemon_environ())
        record = cluster.wait_job(warmup, START_TIMEOUT)
        if record["state"] not in ("COMPLETED", "GONE"):
            raise RuntimeError(f"slurm cluster: the warm-up job ended {record}\n{cluster.log_tails(lines)}")
        _until_up(cluster, lambda: not any(cluster.node_pids(n) for n in names), "warm-up job gone", lines)
        where = ", ".join(f"{n.name} at {n.ip}" for n in nodes)
        print(
            f"\nslurm cluster: nodes idle {up:.1f}s after the start, a first job done after "
            f"{time.monotonic() - start:.1f}s; slurmctld {cluster.controller} at {cluster.controller_ip}, "
            f"nodes {where}; {cluster.conf}"
        )
        yield cluster


def _cancel_all(cluster: SlurmCluster) -> None:
    if cluster.daemons.get("slurmctld") is None or cluster.daemons["slurmctld"].poll() is not None:
        return
    with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
        live = [j["job_id"] for j in cluster.squeue() if j["state"] not in ENDED_STATES]
        if live:
            cluster.run("scancel", *live, check=False, timeout=30)


def _until_up(cluster: SlurmCluster, ready: Callable[[], bool], what: str, lines: int) -> None:
    """Waits for ``ready()``; raises with the daemons' logs if a daemon exits or time runs out."""
    deadline = time.monotonic() + START_TIMEOUT
    while not ready():
        dead = {name: p.returncode for name, p in cluster.daemons.items() if p.poll() is not None}
        if dead or time.monotonic() > deadline:
            why = f"daemons exited: {dead}" if dead else f"not within {START_TIMEOUT:g}s"
            raise RuntimeError(f"slurm cluster: no {what} ({why})\n{cluster.log_tails(lines)}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The session's Slurm cluster (see the module's docstring); started by the first test
    that asks for it, taken down at the end of the session."""
    with start_cluster() as cluster:
        yield cluster


__all__ = ["ENDED_STATES", "SlurmCluster", "SlurmNode", "slurm_cluster", "start_cluster", "unavailable"]
