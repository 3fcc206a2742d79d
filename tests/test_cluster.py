"""The emulated cluster: links run at the set rate, hosts keep their CPU budget, torchrun works across
hosts, and nothing is left behind after success, failure, Ctrl-C, SIGTERM or a crash.

Measured numbers are printed (pytest -s shows them); docs/cluster.md reports them.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tessel.cli import main
from tessel.cluster import cgroups, housekeeping
from tessel.cluster.emulate import HOST_INTERFACE, PERIOD_US, EmulatedCluster, HostFailed, parse_rate
from tessel.cluster.housekeeping import ClusterError, leftovers


def _why_no_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if not shutil.which("ip"):
        return "needs 'ip' (iproute2)"
    r = subprocess.run(["ip", "netns", "add", "tslt-probe"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"'ip netns add' fails here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "tslt-probe"], capture_output=True)
    return None


_why = _why_no_namespaces()
if _why:
    pytest.skip(f"emulated cluster not possible: {_why}", allow_module_level=True)

PREFIX = "tslt"  # not the default "tsl": a cluster someone keeps up is left alone
PY = sys.executable
RECEIVE = """
import socket, sys, threading, time
s = socket.create_server(("0.0.0.0", 5001)); conns = [s.accept()[0] for _ in range(int(sys.argv[1]))]; got = []
def drain(c):
    while b := c.recv(1 << 20):
        got.append(len(b))
threads = [threading.Thread(target=drain, args=(c,)) for c in conns]
[t.start() for t in threads]
start = time.perf_counter()
[c.sendall(b"g") for c in conns]  # every sender starts now, however late its process came up
[t.join() for t in threads]
print(sum(got), time.perf_counter() - start)
"""
SEND = """
import socket, sys, time
for _ in range(500):  # until the receiver listens
    try:
        c = socket.create_connection((sys.argv[2], 5001)); break
    except OSError:
        time.sleep(0.01)
c.recv(1); c.sendall(bytes(int(sys.argv[1]))); c.shutdown(socket.SHUT_WR); c.recv(1)
"""
BUSY = """
import time
t, p, n = time.perf_counter(), time.process_time(), 0
for i in range({n}):
    n += i
print(time.perf_counter() - t, time.process_time() - p)
"""
TINY = ["--model.dim", "16", "--model.layers", "1", "--model.heads", "2", "--vocab", "200", "--seq-len", "8",
        "--batch", "8", "--steps", "3", "--metrics.progress", "log",
        "--metrics.memory", "false", "--metrics.plot", "false", "--metrics.heldout", "false"]


@pytest.fixture(autouse=True)
def clean():
    housekeeping.remove_cluster(PREFIX)
    yield
    left = leftovers(PREFIX)
    housekeeping.remove_cluster(PREFIX)
    assert left == [], left


def transfer_seconds(c: EmulatedCluster, nbytes: int) -> float:
    """Every host but the last sends ``nbytes`` to the last one, all at once; seconds until all arrived."""
    senders = [[PY, "-c", SEND, str(nbytes), c.addresses[-1]]] * (c.hosts - 1)
    got, seconds = c.run([*senders, [PY, "-c", RECEIVE, str(c.hosts - 1)]], timeout=30)[-1].stdout.split()
    assert int(got) == nbytes * (c.hosts - 1)
    return float(seconds)


def test_link_rate_is_the_set_rate():
    nbytes = 4_000_000
    with EmulatedCluster(2, "50mbit", prefix=PREFIX) as c:
        slow = transfer_seconds(c, nbytes)
    with EmulatedCluster(2, "500mbit", prefix=PREFIX) as c:
        fast = transfer_seconds(c, nbytes)
    with EmulatedCluster(3, "50mbit", prefix=PREFIX) as c:
        # two senders share the receiver's link; a shaped link only caps the rate, so a busy machine can only
        # make a transfer slower: the faster of two tries is the link's
        incast = min(transfer_seconds(c, nbytes // 2) for _ in range(2))
    share, incast_share = nbytes * 8 / slow / 50e6, nbytes * 8 / incast / 50e6
    print(f"\n4 MB at 50mbit: {slow:.3f} s = {share:.3f} of the rate; at 500mbit: {fast:.3f} s ({slow / fast:.1f}x "
          f"faster); 2 x 2 MB into one 50mbit host: {incast:.3f} s = {incast_share:.3f} of its rate")
    # TCP/IP and Ethernet headers take ~4.4% of a 1514-byte frame; tbf counts them, so ~0.956 is expected.
    assert 0.8 <= share <= 1.05
    assert 0.8 <= incast_share <= 1.05
    assert slow / fast > 5


def test_hosts_have_own_address_cgroup_and_environment():
    probe = ("import os; print(open('/proc/self/cgroup').read().count('tessel/tslt-h{i}'),"
             " os.environ['OMP_NUM_THREADS'], os.environ['GLOO_SOCKET_IFNAME'])")
    with EmulatedCluster(2, prefix=PREFIX) as c:
        assert c.addresses == ["10.77.0.1", "10.77.0.2"] and c.host_names == ["tslt-h0", "tslt-h1"]
        r = c.run([["hostname", "-I"], ["hostname", "-I"]])
        assert [x.stdout.split() for x in r] == [["10.77.0.1"], ["10.77.0.2"]]
        r = c.run([[PY, "-c", probe.format(i=i)] for i in range(2)])
        assert [x.stdout.split() for x in r] == [["1", "1", "eth0"]] * 2
        assert (c.cgroup(1) / "cpu.cfs_quota_us").read_text().strip() == str(int(c.cpus * PERIOD_US))


def test_period_burst_pin_and_rate_changed_in_place():
    probe = "print(open('/proc/self/status').read().split('Cpus_allowed_list:')[1].split()[0])"
    with EmulatedCluster(2, "50mbit", cpus=0.5, prefix=PREFIX, period_us=20_000, burst_us=5_000, pin=True) as c:
        group = c.cgroup(0)
        assert [(group / f).read_text().strip() for f in ("cpu.cfs_period_us", "cpu.cfs_quota_us", "cpu.cfs_burst_us")
                ] == ["20000", "10000", "5000"]
        assert [r.stdout.strip() for r in c.run([[PY, "-c", probe]] * 2)] == ["0", "1"]  # host i on core i
        slow = transfer_seconds(c, 2_000_000)
        c.set_rate("500mbit")
        fast = transfer_seconds(c, 2_000_000)
        assert EmulatedCluster.attach(PREFIX).rate == "500mbit"
        c.set_rate(None)  # unshaped: no tbf left on either end of a link
        shown = [subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev], capture_output=True, text=True).stdout
                 for ns, dev in ((c.host_names[0], "eth0"), (f"{PREFIX}-sw", f"{PREFIX}-s1"))]
        assert not any("tbf" in t for t in shown), shown
        assert "TESSEL_LINK_MBIT" not in c.run([["env"], ["true"]])[0].stdout
    print(f"\n2 MB at 50mbit {slow:.3f} s, re-shaped in place to 500mbit {fast:.3f} s")
    assert slow / fast > 4  # 2 MB: 0.33 s at 50mbit, 0.033 s at 500mbit
    with pytest.raises(ClusterError, match="period_us must be an integer from 1000"):
        EmulatedCluster(2, prefix=PREFIX, period_us=500)
    with pytest.raises(ClusterError, match=r"burst_us must be an integer from 0 to the quota \(5000 us\)"):
        EmulatedCluster(2, cpus=0.5, prefix=PREFIX, burst_us=6_000)


GLOO_JOB = """
import sys, time, torch, torch.distributed as dist
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="tcp://10.77.0.1:29511", rank=rank, world_size=2)
for _ in range(8):  # the cluster moves gloo's threads as it sees them (every 50 ms)
    dist.all_reduce(torch.ones(1000))
    time.sleep(0.1)
import os, pathlib
for task in pathlib.Path("/proc/self/task").iterdir():
    name = (task / "comm").read_text().strip()
    cpu = next(line.split(":")[2] for line in (task / "cgroup").read_text().splitlines()
               if "cpu" in line.split(":")[1].split(","))
    print(name, cpu)
dist.destroy_process_group()
"""


def test_nic_group_takes_gloo_threads():
    with EmulatedCluster(2, "1gbit", prefix=PREFIX, nic_cpus=0.2) as c:
        assert [(g / "cpu.cfs_quota_us").read_text().strip() for g in (c.cgroup(0), cgroups.nic_group(
            PREFIX, 0))] == [str(int((os.cpu_count() - 0.4) / 2 * PERIOD_US)), str(int(0.2 * PERIOD_US))]
        out = [r.stdout for r in c.run([[PY, "-c", GLOO_JOB, str(i)] for i in range(2)], timeout=60)]
        assert EmulatedCluster.attach(PREFIX).nic_cpus == 0.2
    for host, text in enumerate(out):
        threads = [line.rsplit(" ", 1) for line in text.splitlines()]
        gloo = [g for name, g in threads if name in cgroups.GLOO_THREADS]
        rest = [g for name, g in threads if name not in cgroups.GLOO_THREADS]
        assert gloo and set(gloo) == {f"/tessel/{PREFIX}-h{host}-nic"}, text
        assert set(rest) == {f"/tessel/{PREFIX}-h{host}"}, text  # the main thread and the rest compute
    with pytest.raises(ClusterError, match="nic_cpus must be 0 .* under the machine's"):
        EmulatedCluster(4, prefix=PREFIX, nic_cpus=0.5)


def test_idle_host_does_not_lend_its_cpu():
    loop = [PY, "-c", BUSY.format(n=4_000_000)]
    with EmulatedCluster(2, cpus=0.5, prefix=PREFIX) as c:
        idle = [float(x) for x in c.run([loop, ["true"]])[0].stdout.split()]
        busy = [float(x) for x in c.run([loop, [PY, "-c", BUSY.format(n=12_000_000)]])[0].stdout.split()]
    # Wall / CPU seconds is the slowdown against running unconstrained. It is compared rather than wall times,
    # because the CPU seconds of the same loop vary by ~10% from run to run on this machine.
    slow_idle, slow_busy = idle[0] / idle[1], busy[0] / busy[1]
    print(f"\nbusy loop on a 0.5-CPU host: {idle[0]:.3f} s wall / {idle[1]:.3f} s CPU = {slow_idle:.2f}x with the "
          f"other host idle, {busy[0]:.3f} s / {busy[1]:.3f} s = {slow_busy:.2f}x with it busy; "
          f"ratio {slow_idle / slow_busy:.3f}")
    assert 1.7 <= slow_idle <= 2.6
    assert 1.7 <= slow_busy <= 2.6
    assert 0.8 <= slow_idle / slow_busy <= 1.2


def test_tessel_train_under_torchrun_across_hosts(tmp_path):
    start = time.monotonic()
    with EmulatedCluster(2, "200mbit", prefix=PREFIX) as c:
        cmds = c.torchrun_commands(["-m", "tessel", "train", *TINY, "--out", str(tmp_path / "run"),
                                    "--metrics.interface", HOST_INTERFACE, "--vocab", "4000", "--model.dim", "32",
                                    "--checkpoint.enabled", "false"])
        r = c.run(cmds, timeout=150, cwd=tmp_path)
    print(f"\n2-host torchrun of 'tessel train' (3 steps): {time.monotonic() - start:.1f} s including up and down")
    assert [x.returncode for x in r] == [0, 0], r[0].stderr[-2000:] + r[1].stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "world 2" in r[0].stdout
    # each host's interface carried at least what tessel.comm counted of the same steps (the two ranks send alike),
    # and not much more: TCP/IP headers (one per 64 KiB segment on a veth) and the acknowledgements of what it
    # received (seen: 1.0099x). No checkpoint: DCP's save plans travel on torch's own collectives (~0.9 MB here).
    counted = sum(v["sent_per_step_per_rank"] for v in summary["bytes"].values()) * summary["steps_run"]
    wire = summary["wire_sent_per_rank"]
    print(f"counted {counted:.0f} B per rank, the interfaces sent {wire} B")
    assert len(wire) == 2 and all(counted <= w <= 1.1 * counted for w in wire), (counted, wire)


def test_failure_stops_the_other_hosts_and_cleans_up():
    start = time.monotonic()
    with pytest.raises(HostFailed, match=r"host 1 \(tslt-h1, 10\.77\.0\.2\) exited with code 3") as e:
        with EmulatedCluster(2, prefix=PREFIX) as c:
            c.run([["sleep", "30"], ["sh", "-c", "sleep 0.2; exit 3"]])
    assert time.monotonic() - start < 10
    assert [x.returncode for x in e.value.results] == [-signal.SIGTERM, 3]
    assert leftovers(PREFIX) == []
    with pytest.raises(HostFailed, match=r"host 0 .* did not finish within 0\.5 s"):
        with EmulatedCluster(2, prefix=PREFIX) as c:
            c.run([["sleep", "30"], ["sleep", "30"]], timeout=0.5)


def test_a_host_over_its_memory_limit_fails_as_out_of_memory():
    """``memory``: each host's processes held to a cgroup limit; a host that allocates past it loses the process to
    the kernel's OOM killer, and the failure says so (as a plan that does not fit a device fails), whichever
    host ended first; a host under it runs as before and reports its peak; the memory groups go with the
    cluster."""
    grab = [PY, "-c", "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(5)"]
    small = [PY, "-c", "b = bytearray(8 * 2**20); b[::4096] = b'x' * len(b[::4096])"]
    with pytest.raises(HostFailed, match=r"host 1 .* ran out of its memory limit \(128 MiB\).*does not fit") as e:
        with EmulatedCluster(2, prefix=PREFIX, memory=128 * 2**20) as c:
            assert (cgroups.memory_group(PREFIX, 0) / "memory.limit_in_bytes").read_text().strip() == str(2**27)
            ran = c.run([small, small])
            assert [r.out_of_memory for r in ran] == [False, False]
            # each host's own peak in this run: the 8 MiB it touched and an interpreter, under the limit
            assert all(8 * 2**20 < r.peak_memory < 128 * 2**20 for r in ran), [r.peak_memory for r in ran]
            c.run([["sleep", "30"], grab])
    assert [r.out_of_memory for r in e.value.results] == [False, True]
    assert leftovers(PREFIX) == [] and not cgroups.memory_group(PREFIX, 0).exists()
    with pytest.raises(ClusterError, match="at least 64 MiB"):
        EmulatedCluster(1, prefix=PREFIX, memory=1000)


def _ctrl_c_as_on_a_terminal() -> None:
    """In the child: SIGINT handled by default. A suite started in the background of a non-interactive shell
    (``pytest &``) inherits SIGINT ignored, and so would the command under test, which then never sees Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_cleans_up(sig):
    p = subprocess.Popen([PY, "-m", "tessel", "cluster", "run", "--hosts", "2", "--prefix", PREFIX, "--",
                          "sleep", "30"], stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_as_on_a_terminal)
    procs = [Path(f"/sys/fs/cgroup/cpu/tessel/{PREFIX}-h{i}/cgroup.procs") for i in range(2)]
    deadline = time.monotonic() + 30
    while not all(f.exists() and f.read_text().strip() for f in procs):
        assert time.monotonic() < deadline and p.poll() is None, p.stderr.read() if p.poll() is not None else ""
        time.sleep(0.05)
    pids = [int(x) for f in procs for x in f.read_text().split()]
    p.send_signal(sig)
    assert p.wait(timeout=15) == 130
    assert "interrupted" in p.stderr.read()
    assert leftovers(PREFIX) == []
    assert not any(housekeeping.live(pid) for pid in pids)


HELD = """
from tessel.cluster.emulate import EmulatedCluster
with EmulatedCluster(2, prefix="{prefix}", nic_cpus=0.2, pin=True) as c:
    c.run([["sleep", "30"]] * 2)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_removes_nic_and_cpuset_groups(sig):
    """A cluster with a NIC group and a cpuset group per host, stopped by a signal: every group goes."""
    p = subprocess.Popen([PY, "-c", HELD.format(prefix=PREFIX)], stderr=subprocess.PIPE, text=True,
                         preexec_fn=_ctrl_c_as_on_a_terminal)
    want = {f"{PREFIX}-h{i}{kind}" for i in range(2) for kind in ("", "-nic")}
    deadline = time.monotonic() + 30
    while not (want <= {g.name for g in cgroups.host_cgroups(PREFIX)}
               and any("cpuset" in str(g) for g in cgroups.host_cgroups(PREFIX))
               and Path(f"/sys/fs/cgroup/cpu/tessel/{PREFIX}-h1/cgroup.procs").read_text().strip()):
        assert time.monotonic() < deadline and p.poll() is None, p.stderr.read() if p.poll() is not None else ""
        time.sleep(0.05)
    p.send_signal(sig)
    p.wait(timeout=15)
    assert leftovers(PREFIX) == [], p.stderr.read()


def test_up_recovers_from_a_crashed_run():
    crash = (f"import os, subprocess\nfrom tessel.cluster.emulate import EmulatedCluster\n"
             f"EmulatedCluster(2, prefix='{PREFIX}').up()\n"
             f"p = subprocess.Popen(['ip', 'netns', 'exec', '{PREFIX}-h0', 'sleep', '60'], start_new_session=True,\n"
             "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
             "print(p.pid, flush=True)\nos._exit(0)\n")
    orphan = int(subprocess.run([PY, "-c", crash], capture_output=True, text=True, check=True).stdout)
    assert len(leftovers(PREFIX)) == 6 and housekeeping.live(orphan)
    with EmulatedCluster(2, prefix=PREFIX) as c:
        assert not housekeeping.live(orphan)
        assert [x.returncode for x in c.run([["true"], ["true"]])] == [0, 0]


def test_delay_is_applied_or_refused():
    try:
        with EmulatedCluster(2, delay="20ms", prefix=PREFIX) as c:
            # the go byte and the first data take one round trip: 2 x 20 ms
            assert transfer_seconds(c, 1) >= 0.035
    except ClusterError as e:
        print(f"\n{e}")
        assert "netem" in str(e) and "0ms" in str(e)
        assert leftovers(PREFIX) == []


def test_cli(capfd):
    assert main(["cluster", "run", "--prefix", PREFIX, "--", "true"]) == 2
    err = capfd.readouterr().err.strip()
    assert err.startswith("tessel: error: no emulated cluster 'tslt' is up") and len(err.splitlines()) == 1
    assert main(["cluster", "up", "--prefix", PREFIX, "--hosts", "2", "--rate", "100mbit", "--cpus", "0.7"]) == 0
    assert main(["cluster", "status", "--prefix", PREFIX]) == 0
    out = capfd.readouterr().out
    assert "2 hosts" in out and "rate 100mbit" in out and "0.7 CPU" in out and "10.77.0.2  netns tslt-h1" in out
    assert main(["cluster", "run", "--prefix", PREFIX, "--", "true"]) == 0
    assert main(["cluster", "run", "--prefix", PREFIX, "--hosts", "2", "--", "true"]) == 2  # would replace it
    fail_on_h1 = 'hostname -I; [ "$(hostname -I)" = "10.77.0.1 " ] || { sleep 0.3; exit 1; }'
    assert main(["cluster", "run", "--prefix", PREFIX, "--", "sh", "-c", fail_on_h1]) == 1
    out, err = capfd.readouterr()
    assert "10.77.0.1" in out and "10.77.0.2" in out
    assert "host 0 (10.77.0.1) exited with code 0" in err and "host 1 (10.77.0.2) exited with code 1" in err
    assert main(["cluster", "down", "--prefix", PREFIX]) == 0
    assert main(["cluster", "run", "--prefix", PREFIX, "--hosts", "2", "--rate", "10mbit", "--", "true"]) == 0
    assert leftovers(PREFIX) == []


def test_bad_input_is_refused(monkeypatch, tmp_path):
    for bad in ["fast", "10mbps", "-5mbit", "0", "1 gbps"]:
        with pytest.raises(ClusterError, match="kbit, mbit or gbit, e.g. 500kbit, 200mbit, 1gbit"):
            parse_rate(bad)
    assert parse_rate("200mbit") == 200e6 and parse_rate("1.5gbit") == 1.5e9 and parse_rate("1000") == 1000
    with pytest.raises(ClusterError, match="hosts must be an integer from 1"):
        EmulatedCluster(0)
    with pytest.raises(ClusterError, match="prefix"):
        EmulatedCluster(2, prefix="much-too-long")
    with pytest.raises(ClusterError, match="delay"):
        EmulatedCluster(2, delay="soon")
    monkeypatch.setattr(housekeeping, "CGROUP_ROOT", tmp_path / "no" / "cgroup")
    with pytest.raises(ClusterError, match="cgroup v1 cpu controller mounted there and writable"):
        EmulatedCluster(2, prefix=PREFIX).up()
    monkeypatch.setattr(housekeeping.shutil, "which", lambda tool: None if tool == "tc" else "/usr/sbin/" + tool)
    with pytest.raises(ClusterError, match="needs 'tc'"):
        EmulatedCluster(2, prefix=PREFIX).up()
    monkeypatch.setattr(housekeeping.os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="needs root"):
        EmulatedCluster(2, prefix=PREFIX).up()
