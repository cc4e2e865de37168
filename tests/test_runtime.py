"""qkv.runtime: the CPUs, the quota, the load and the choice, from files and values (no timing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from qkv import runtime
from qkv.runtime import (
    Cpus,
    Load,
    LoadWatch,
    StatSample,
    cgroup_cpu_quota,
    choose,
    configure_threads,
    physical_cores,
    read_stat,
)

TWO = Cpus((0, 1), cores=2, online=2)


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ---------------------------------------------------------------------------- the CPUs
def test_cpus_capacity_threads_and_restriction():
    assert (TWO.capacity, TWO.threads, TWO.restricted) == (2.0, 2, False)
    hyper = Cpus((0, 1, 2, 3), cores=2, online=4)  # two cores with two hyperthreads each
    assert (hyper.capacity, hyper.threads, hyper.restricted) == (4.0, 2, False)
    quota = Cpus((0, 1, 2, 3), cores=4, quota=1.5, online=4)
    assert (quota.capacity, quota.threads, quota.restricted) == (1.5, 1, True)
    pinned = Cpus((2, 3), cores=2, online=8)  # taskset -c 2,3
    assert (pinned.threads, pinned.restricted) == (2, True)
    assert Cpus((0,), cores=1, quota=0.25).threads == 1
    assert pinned.describe() == "2 CPUs of 8"
    assert quota.describe() == "4 CPUs, cgroup quota 1.5 CPUs"
    assert hyper.describe() == "4 CPUs (2 cores)"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(ids=(), cores=1), "ids: expected at least one CPU"),
        (dict(ids=(0,), cores=0), "cores: expected an int >= 1, got 0"),
        (dict(ids=(0,), cores=1, quota=0.0), "quota: expected a positive number"),
    ],
)
def test_cpus_refuse_impossible_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Cpus(**kwargs)


def test_cgroup_v2_quota_is_the_smallest_on_the_way_up(tmp_path):
    _write(tmp_path, "proc", "0::/user.slice/app\n")
    _write(tmp_path, "cg/user.slice/app/cpu.max", "150000 100000\n")
    _write(tmp_path, "cg/user.slice/cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") == 1.5
    _write(tmp_path, "cg/cpu.max", "50000 100000\n")  # the root's is smaller
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") == 0.5


def test_cgroup_v2_without_a_quota_or_readable_files(tmp_path):
    _write(tmp_path, "proc", "0::/app\n")
    _write(tmp_path, "cg/app/cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") is None
    _write(tmp_path, "cg/app/cpu.max", "lots 100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") is None
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "no-such-file") is None


def test_cgroup_v2_in_a_container_reads_the_mounts_root(tmp_path):
    # /proc/self/cgroup names the host's path; the container sees its own cgroup as the root
    _write(tmp_path, "proc", "0::/kubepods/pod1/abc\n")
    _write(tmp_path, "cg/cpu.max", "200000 100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") == 2.0


@pytest.mark.parametrize("folder", ["cpu", "cpu,cpuacct"])
def test_cgroup_v1_quota(tmp_path, folder):
    _write(tmp_path, "proc", "5:memory:/docker/x\n4:cpu,cpuacct:/docker/x\n0::/\n")
    _write(tmp_path, f"cg/{folder}/docker/x/cpu.cfs_quota_us", "300000\n")
    _write(tmp_path, f"cg/{folder}/docker/x/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") == 3.0
    _write(tmp_path, f"cg/{folder}/docker/x/cpu.cfs_quota_us", "-1\n")
    assert cgroup_cpu_quota(tmp_path / "cg", tmp_path / "proc") is None


def test_physical_cores_count_hyperthreads_once(tmp_path):
    for cpu, core in enumerate([0, 0, 1, 1]):
        _write(tmp_path, f"cpu{cpu}/topology/core_id", f"{core}\n")
        _write(tmp_path, f"cpu{cpu}/topology/physical_package_id", "0\n")
    assert physical_cores([0, 1, 2, 3], tmp_path) == 2
    assert physical_cores([0, 2], tmp_path) == 2
    assert physical_cores([0, 1], tmp_path) == 1
    assert physical_cores([0, 7], tmp_path) == 2  # cpu7 unreadable: every CPU counts


# ---------------------------------------------------------------------------- the load
STAT = """cpu  {a} 0 {b} 9000 10 0 0 0 0 0
cpu0 {a0} 0 0 4500 5 0 0 0 0 0
cpu1 {a1} 0 {b} 4500 5 0 0 0 0 0
intr 12345
"""


def test_read_stat_counts_the_chosen_cpus_busy_time(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime.os, "sysconf", lambda name: 100)
    path = tmp_path / "stat"
    path.write_text(STAT.format(a=300, b=100, a0=100, a1=200))
    whole = read_stat(None, path, now=1.0, own=0.5)
    assert whole == StatSample(1.0, 4.0, 0.5)  # (300 + 100) ticks at 100 per second
    assert read_stat([1], path, now=1.0, own=0.0).busy == 3.0  # 200 + 100
    assert read_stat([0], path, now=1.0, own=0.0).busy == 1.0
    assert read_stat([5], path, now=1.0, own=0.0) is None  # no such CPU
    assert read_stat([0], tmp_path / "missing") is None


NICED = "cpu  500 400 100 9000 10 0 0 0 0 0\ncpu0 500 400 100 9000 10 0 0 0 0 0\n"


def test_niced_processes_time_is_not_busy_for_a_process_at_nice_0(tmp_path, monkeypatch):
    """Background jobs under `nice` yield their CPUs to qkv at nice 0 (benchmarks/threads.py:
    beside niced work two spinning threads trained 1.24x faster than the one thread their
    counted load gave); a qkv that runs niced itself counts them (they may be as niced)."""
    monkeypatch.setattr(runtime.os, "sysconf", lambda name: 100)
    path = tmp_path / "stat"
    path.write_text(NICED)
    assert read_stat([0], path, now=1.0, own=0.0, count_nice=False).busy == 6.0  # 500 + 100
    assert read_stat([0], path, now=1.0, own=0.0, count_nice=True).busy == 10.0
    monkeypatch.setattr(runtime.os, "getpriority", lambda which, who: 0, raising=False)
    assert not runtime.runs_niced() and read_stat([0], path, now=1.0, own=0.0).busy == 6.0
    monkeypatch.setattr(runtime.os, "getpriority", lambda which, who: 15, raising=False)
    assert runtime.runs_niced() and read_stat([0], path, now=1.0, own=0.0).busy == 10.0


def test_load_between_takes_this_processs_own_time_out():
    before, after = StatSample(10.0, 100.0, 5.0), StatSample(12.0, 103.8, 5.8)
    load = Load.between(before, after)
    assert load.seconds == 2.0 and load.others == pytest.approx((3.8 - 0.8) / 2)
    # this process ran on CPUs outside the look (a sampling edge): never negative
    assert Load.between(after, StatSample(13.0, 104.0, 6.5)).others == 0.0
    with pytest.raises(ValueError, match="after: expected a reading later"):
        Load.between(after, before)


def test_others_load_reads_stat_twice_around_its_look(tmp_path, monkeypatch):
    """A given load: over the look (a sleep, here a file rewritten), cpu1 spent 0.3 s busy of
    which this process used 0.1 s; cpu0 (outside the mask) is not counted."""
    monkeypatch.setattr(runtime.os, "sysconf", lambda name: 100)
    path, own = tmp_path / "stat", [1.0]
    monkeypatch.setattr(runtime.os, "times", lambda: type("T", (), {"user": own[0], "system": 0.0}))
    clock = [5.0]
    monkeypatch.setattr(runtime.time, "monotonic", lambda: clock[0])
    path.write_text(STAT.format(a=300, b=0, a0=100, a1=200))

    def look(seconds: float) -> None:  # the others kept cpu1 busy while it slept
        assert seconds == 0.2
        clock[0] += seconds
        own[0] += 0.1
        path.write_text(STAT.format(a=530, b=0, a0=300, a1=230))

    monkeypatch.setattr(runtime.time, "sleep", look)
    load = runtime.others_load([1], 0.2, stat=path)
    assert load.seconds == pytest.approx(0.2) and load.others == pytest.approx((0.3 - 0.1) / 0.2)
    assert load.busy_cpus == 1
    assert runtime.others_load([1], 0.2, stat=tmp_path / "missing") is None


def test_machine_cpus_are_the_affinity_masks_not_the_machines(monkeypatch):
    """``taskset -c 2,3`` on an 8-CPU machine: two CPUs, so two threads on a quiet machine set
    explicitly (torch's default would take all 8 cores)."""
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {3, 2}, raising=False)
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(runtime, "physical_cores", lambda ids: len(list(ids)))
    monkeypatch.setattr(runtime, "cgroup_cpu_quota", lambda: None)
    cpus = runtime.machine_cpus()
    assert cpus == Cpus((2, 3), cores=2, quota=None, online=8) and cpus.restricted
    c = choose(cpus, Load(0.0, 0.2), {})
    assert (c.threads, dict(c.env)) == (2, {"OMP_NUM_THREADS": "2"})
    assert "one thread per core this process may use" in c.reason


def test_machine_cpus_take_the_cgroup_quota(monkeypatch):
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(runtime, "physical_cores", lambda ids: 4)
    monkeypatch.setattr(runtime, "cgroup_cpu_quota", lambda: 1.5)
    cpus = runtime.machine_cpus()
    assert (cpus.capacity, cpus.threads, cpus.restricted) == (1.5, 1, True)


@pytest.mark.parametrize("others, busy", [(0.0, 0), (0.49, 0), (0.5, 1), (1.4, 1), (1.9, 2)])
def test_busy_cpus_rounds_half_up(others, busy):
    assert Load(others, 1.0).busy_cpus == busy


# ---------------------------------------------------------------------------- the choice
def test_a_quiet_machine_keeps_torchs_default():
    c = choose(TWO, Load(0.2, 0.2), {})
    assert (c.threads, c.wait_policy, dict(c.env), c.automatic) == (None, None, {}, True)
    assert "quiet: torch's default" in c.reason
    assert choose(TWO, None, {}).threads is None  # no /proc/stat: taken as quiet


@pytest.mark.parametrize("others, threads", [(0.6, 1), (1.0, 1), (2.0, 1), (3.5, 1)])
def test_busy_two_cpus_get_one_thread_and_no_passive_wait(others, threads):
    c = choose(TWO, Load(others, 0.2), {})
    assert (c.threads, c.wait_policy, dict(c.env)) == (threads, None, {"OMP_NUM_THREADS": "1"})
    assert c.automatic and "one thread per free CPU" in c.reason
    assert f"others kept {others:.1f} CPUs busy" in c.describe()


def test_busy_many_cores_get_the_free_ones():
    eight = Cpus(tuple(range(8)), cores=8, online=8)
    assert choose(eight, Load(3.0, 0.2), {}).threads == 5
    hyper = Cpus(tuple(range(16)), cores=8, online=16)  # 8 cores, 16 hyperthreads
    assert choose(hyper, Load(4.0, 0.2), {}).threads == 8  # 12 free CPUs, 8 cores


def test_a_quota_restricts_a_quiet_machine_too():
    c = choose(Cpus(tuple(range(64)), cores=32, quota=2.0, online=64), Load(0.0, 0.2), {})
    assert (c.threads, dict(c.env)) == (2, {"OMP_NUM_THREADS": "2"})


def test_the_users_wait_policy_wins():
    c = choose(TWO, Load(2.0, 0.2), {"OMP_WAIT_POLICY": "active"})
    assert c.wait_policy == "active" and "OMP_WAIT_POLICY" not in c.env
    assert "OMP_WAIT_POLICY=active given" in c.reason
    assert (c.threads, dict(c.env)) == (1, {"OMP_NUM_THREADS": "1"})  # still one per free CPU
    c = choose(TWO, Load(2.0, 0.2), {"GOMP_SPINCOUNT": "10"})
    assert c.wait_policy == "as GOMP_SPINCOUNT=10 says" and "OMP_WAIT_POLICY" not in c.env


@pytest.mark.parametrize(
    "env, threads, given",
    [({"OMP_NUM_THREADS": "2"}, None, "OMP_NUM_THREADS"), ({}, 2, "--threads")],
)
def test_the_users_thread_count_wins_and_waits_passively_when_it_does_not_fit(env, threads, given):
    c = choose(TWO, Load(1.0, 0.2), env, threads)
    assert (c.threads, c.wait_policy, c.automatic) == (2, "PASSIVE", False)
    assert dict(c.env) == {"OMP_WAIT_POLICY": "PASSIVE"} and f"{given} given" in c.reason
    quiet = choose(TWO, Load(0.0, 0.2), env, threads)  # it fits: nothing to change
    assert (quiet.threads, quiet.wait_policy, dict(quiet.env)) == (2, None, {})
    both = choose(TWO, Load(1.0, 0.2), {**env, "OMP_WAIT_POLICY": "ACTIVE"}, threads)
    assert (both.threads, both.wait_policy, dict(both.env)) == (2, "ACTIVE", {})


def test_what_qkv_set_itself_is_not_the_users():
    env = {"OMP_NUM_THREADS": "1", "QKV_THREADS_SET": "OMP_NUM_THREADS=1"}
    assert choose(TWO, Load(0.0, 0.2), env).threads is None  # a quiet child decides again
    env["OMP_NUM_THREADS"] = "2"  # changed since: the user's
    assert choose(TWO, Load(0.0, 0.2), env).automatic is False


def test_qkv_auto_threads_0_turns_it_off():
    c = choose(TWO, Load(2.0, 0.2), {"QKV_AUTO_THREADS": "0"})
    assert (c.threads, c.wait_policy, dict(c.env), c.automatic) == (None, None, {}, False)
    assert "left to torch" in c.reason


def test_choose_refuses_a_thread_count_that_is_not_an_int():
    with pytest.raises(TypeError, match="threads: expected an int or None, got '2'"):
        choose(TWO, None, {}, "2")


# ---------------------------------------------------------------------------- applying it
@pytest.fixture
def machine(monkeypatch):
    """A 2-CPU machine whose others' load the test sets (``machine.load``)."""

    class Machine:
        load: Load | None = Load(1.0, 0.2)

    m = Machine()
    monkeypatch.setattr(runtime, "machine_cpus", lambda: TWO)
    monkeypatch.setattr(runtime, "others_load", lambda cpus, look: m.load)
    monkeypatch.setattr(runtime, "_CHOSEN", None)
    return m


def test_configure_sets_the_environment_before_torch_loads(machine, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # as in a fresh `qkv` process
    env: dict[str, str] = {}
    c = configure_threads(environ=env)
    assert c.applied and env == {"OMP_NUM_THREADS": "1", "QKV_THREADS_SET": "OMP_NUM_THREADS=1"}
    assert runtime.current_choice() is c


def test_configure_changes_nothing_once_torch_is_loaded(machine, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch", object()))
    env: dict[str, str] = {}
    c = configure_threads(environ=env)
    assert not c.applied and env == {} and "torch was loaded before" in c.reason
    assert LoadWatch.for_this_process() is None  # nothing of ours to follow


@pytest.mark.parametrize("look", [-1, 11, True, "0.2"])
def test_configure_refuses_a_bad_look(look):
    with pytest.raises(ValueError, match="look: expected seconds in"):
        configure_threads(look=look, environ={})


# ---------------------------------------------------------------------------- long runs
def test_the_watch_switches_only_when_two_checks_agree():
    w = LoadWatch(TWO, 2, stat="/no/such/file")
    assert w.observe(Load(1.0, 30.0)) is None  # a first busy check: maybe a blip
    assert w.observe(Load(0.0, 30.0)) is None  # it was
    assert w.observe(Load(1.2, 30.0)) is None
    assert w.observe(Load(1.1, 30.0)) == 1 and w.threads == 1  # busy twice: one thread
    assert w.observe(Load(1.0, 30.0)) is None
    assert w.observe(Load(0.1, 30.0)) is None
    assert w.observe(Load(0.2, 30.0)) == 2  # quiet twice: back to two


def test_the_watch_polls_stat_on_its_clock(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime.os, "sysconf", lambda name: 100)
    monkeypatch.setattr(runtime.os, "times", lambda: type("T", (), {"user": 0.0, "system": 0.0}))
    path, now = tmp_path / "stat", [0.0]
    ticks = {"a0": 0, "a1": 0}

    def at(t: float, busy_per_s: float) -> None:
        # the other CPU kept busy_per_s busy since the last reading
        ticks["a1"] += round(100 * busy_per_s * (t - now[0]))
        now[0] = t
        a = ticks["a0"] + ticks["a1"]
        path.write_text(STAT.format(a=a, b=0, a0=ticks["a0"], a1=ticks["a1"]))

    at(0.0, 0.0)
    w = LoadWatch(TWO, 2, every=30.0, stat=path, clock=lambda: now[0])
    at(10.0, 1.0)
    assert w.poll() is None and w.last_load is None  # not time to look yet
    at(30.0, 1.0)
    assert w.poll() is None and w.last_load.others == pytest.approx(1.0)
    at(60.0, 1.0)
    assert w.poll() == 1


def test_the_watch_refuses_bad_settings():
    with pytest.raises(ValueError, match="threads: expected an int >= 1, got 0"):
        LoadWatch(TWO, 0)
    with pytest.raises(ValueError, match="every: expected seconds > 0"):
        LoadWatch(TWO, 1, every=0)


# ---------------------------------------------------------------------------- counts not used as given
@pytest.mark.parametrize("value", ["0", "junk", "-3", ""])
def test_a_thread_count_that_is_not_one_is_replaced_and_warned_about(value):
    c = choose(TWO, Load(0.1, 0.2), {"OMP_NUM_THREADS": value})
    assert c.automatic and c.threads == 2
    assert dict(c.env) == {"OMP_NUM_THREADS": "2"}  # OpenMP never reads the bad value
    assert c.invalid == (
        f"OMP_NUM_THREADS={value!r} is not a thread count (expected a whole number >= 1): "
        f"ignored, 2 threads used instead ({c.reason})",
    )
    busy = choose(TWO, Load(1.9, 0.2), {"MKL_NUM_THREADS": value})
    assert dict(busy.env) == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert busy.invalid[0].startswith(f"MKL_NUM_THREADS={value!r} is not a thread count")
    assert "1 thread used instead" in busy.invalid[0]


@pytest.mark.parametrize("value", ["1,2", " 1 , 2"])
def test_openmps_list_of_counts_per_level_is_a_count(value):
    """``OMP_NUM_THREADS=1,2`` is OpenMP's list of counts per nesting level (libgomp reads
    it, torch runs the first): it was called invalid and replaced."""
    c = choose(TWO, Load(0.1, 0.2), {"OMP_NUM_THREADS": value})
    assert (c.threads, c.automatic, c.invalid, dict(c.env)) == (1, False, (), {})
    assert "OMP_NUM_THREADS given" in c.reason
    for wrong in ("1,x", "1,0", "1,", ","):  # libgomp refuses these
        assert choose(TWO, Load(0.1, 0.2), {"OMP_NUM_THREADS": wrong}).invalid
    # MKL reads one number
    assert choose(TWO, Load(0.1, 0.2), {"MKL_NUM_THREADS": "1,2"}).invalid


def test_more_threads_than_cpus_given_is_warned_about(monkeypatch):
    """``--threads 8`` on 2 CPUs ran 8 threads taking turns (slower), and nothing said so."""
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch(8))
    c = choose(TWO, Load(0.1, 0.2), {}, threads=8)
    assert c.warnings() == [
        f"--threads=8: 8 threads on the {TWO.describe()} this process may use take turns on "
        "them, slower than 2 would be"
    ]
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch(3))
    quota = Cpus((0, 1, 2, 3), 4, quota=1.5)
    assert choose(quota, None, {"OMP_NUM_THREADS": "3"}).warnings() == [
        "OMP_NUM_THREADS=3: 3 threads on the 4 CPUs, cgroup quota 1.5 CPUs this process may "
        "use take turns on them, slower than 2 would be"
    ]
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch(2))
    for fine in (choose(TWO, None, {}, threads=2), choose(quota, None, {}, threads=2)):
        assert fine.warnings() == []
    monkeypatch.delitem(sys.modules, "torch")  # before torch loads: not said yet
    assert choose(TWO, None, {}, threads=8).warnings() == []


def test_a_bad_variable_beside_a_good_one_takes_the_good_ones_count():
    c = choose(TWO, Load(0.1, 0.2), {"OMP_NUM_THREADS": "junk", "MKL_NUM_THREADS": "1"})
    assert (c.threads, c.automatic, dict(c.env)) == (1, False, {"OMP_NUM_THREADS": "1"})
    assert "MKL_NUM_THREADS given" in c.reason and "1 thread used instead" in c.invalid[0]


class _FakeTorch:
    def __init__(self, n: int) -> None:
        self.n = n

    def get_num_threads(self) -> int:
        return self.n


def test_a_count_torch_does_not_run_is_reported_as_torch_runs_it(monkeypatch):
    c = choose(TWO, Load(0.1, 0.2), {"OMP_NUM_THREADS": "99999"})
    assert c.threads == 99999 and c.invalid == ()
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch(2))
    assert c.describe().startswith("threads: 2 of 2 CPUs") and "99999 of" not in c.describe()
    assert c.warnings() == ["OMP_NUM_THREADS=99999 was not honoured: torch runs 2 threads"]
    monkeypatch.setitem(sys.modules, "torch", _FakeTorch(1))
    assert c.warnings() == ["OMP_NUM_THREADS=99999 was not honoured: torch runs 1 thread"]
    honoured = choose(TWO, Load(0.1, 0.2), {}, threads=1)
    assert honoured.warnings() == [] and honoured.describe().startswith("threads: 1 of")
    monkeypatch.delitem(sys.modules, "torch")  # before torch loads: the count chosen
    assert c.describe().startswith("threads: 99999 of") and c.warnings() == []


def test_thread_count_says_one_thread():
    assert [runtime.thread_count(n) for n in (1, 2)] == ["1 thread", "2 threads"]
