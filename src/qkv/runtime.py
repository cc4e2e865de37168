"""torch's CPU threads chosen from the machine's state, before torch starts its OpenMP runtime.

torch's CPU threads are OpenMP threads (GNU libgomp in the CPU wheels). A thread that waits for
work spins for a while before it sleeps, which is fast on an idle machine and ruinous beside
other busy processes: the spinning threads take the cores the thread they wait for needs, and a
loop of small operations (decoding, a small model's training) runs 3-5x slower
(``benchmarks/threads.py``). qkv therefore looks at the machine once, before torch loads:

* **the CPUs this process may use**: its affinity mask (``os.sched_getaffinity``), the physical
  cores among them (sysfs's topology), and the cgroup CPU quota (v2 ``cpu.max``, v1
  ``cpu.cfs_quota_us``/``cpu.cfs_period_us``), not ``os.cpu_count()``;
* **how busy the others keep them**: a short look (:data:`LOOK_S`) at the kernel's CPU times,
  the CPU time spent on those CPUs minus this process's own; niced processes' time does not
  count for a process at nice 0, since they yield to it (:func:`read_stat`).

The files are read by :mod:`qkv._machine`, the one module of qkv that reads procfs, sysfs and
the cgroups; its readers are importable from here (:func:`cgroup_cpu_quota`,
:func:`physical_cores`, :func:`read_stat`, :class:`StatSample`, :func:`runs_niced`).

On a quiet machine nothing changes (torch's own thread count, libgomp's wait). When others keep
CPUs busy, torch gets one thread per CPU left free (at least one): threads that have a core each
can spin without stealing one, and a single thread never waits for another. A thread count that
is the user's (``--threads``, ``OMP_NUM_THREADS``) and does not fit in the free CPUs gets passive
waiting instead (``OMP_WAIT_POLICY=PASSIVE``). Whatever the user set wins: ``OMP_WAIT_POLICY``,
``GOMP_SPINCOUNT`` or ``KMP_BLOCKTIME`` (the wait), ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` or
``--threads`` (the count); ``QKV_AUTO_THREADS=0`` turns the whole choice off. A count that is
not one (``0``, ``-3``, ``junk``) is replaced by qkv's choice, with a warning naming it; a
count torch does not run (it caps its threads: ``OMP_NUM_THREADS=99999`` runs as many as it
allows) is reported as torch runs it, with a warning (:meth:`ThreadChoice.warnings`).

The ``qkv`` command (and ``python -m qkv``) calls :func:`configure_threads` before anything loads
torch, and logs :meth:`ThreadChoice.describe`. In a program of your own, call it before the
first ``import torch`` (``import qkv`` does not load torch)::

    import qkv.runtime
    choice = qkv.runtime.configure_threads()   # reads the machine, sets the environment
    import torch                               # starts OpenMP with that choice
    print(choice.describe())

A long run follows the machine afterwards: :class:`LoadWatch` re-reads the load every
:attr:`LoadWatch.EVERY_S` seconds and asks for another thread count (``torch.set_num_threads``,
which clears oneDNN's cache of primitives, so only after two checks agree); the wait policy
cannot change in a running process.

This module imports nothing of qkv but :mod:`qkv._machine` and never imports torch at module
level (floor 0).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field

from ._machine import StatSample, cgroup_cpu_quota, physical_cores, read_stat, runs_niced

__all__ = [
    "LOOK_S",
    "Cpus",
    "Load",
    "LoadWatch",
    "StatSample",
    "ThreadChoice",
    "auto_threads",
    "cgroup_cpu_quota",
    "choose",
    "configure_threads",
    "current_choice",
    "follow",
    "follow_in_background",
    "machine_cpus",
    "others_load",
    "physical_cores",
    "read_stat",
    "runs_niced",
    "thread_count",
    "torch_threads",
]

log = logging.getLogger(__name__)

#: the look at the kernel's CPU times before torch loads, in seconds
LOOK_S = 0.2
#: other processes' use (in CPUs) that counts as one busy CPU: 0.5 and up rounds to one
BUSY_CPU = 0.5
#: the variables that set how OpenMP's threads wait: the standard one, libgomp's, LLVM/Intel's
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
#: the variables that set torch's thread count (read in this order by torch)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: ``QKV_AUTO_THREADS=0`` leaves threads and waiting to torch and OpenMP
OFF_VAR = "QKV_AUTO_THREADS"
#: what qkv set itself (``NAME=VALUE`` pairs, ``;``-separated): a child ``qkv`` decides again
MARK_VAR = "QKV_THREADS_SET"


# ---------------------------------------------------------------------------- the CPUs
@dataclass(frozen=True)
class Cpus:
    """The CPUs this process may use.

    Attributes:
        ids: the logical CPUs of its affinity mask.
        cores: the physical cores among them (hyperthreads of one core count once).
        quota: the cgroup CPU quota in CPUs (``1.5``: 150 ms per 100 ms), None without one.
        online: the logical CPUs of the machine (``os.cpu_count()``).
    """

    ids: tuple[int, ...]
    cores: int
    quota: float | None = None
    online: int | None = None

    def __post_init__(self) -> None:
        if not self.ids:
            raise ValueError("ids: expected at least one CPU, got none")
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 1:
            raise ValueError(f"cores: expected an int >= 1, got {self.cores!r}")
        if self.quota is not None and not (self.quota > 0 and math.isfinite(self.quota)):
            raise ValueError(
                f"quota: expected a positive number of CPUs or None, got {self.quota!r}"
            )

    @property
    def capacity(self) -> float:
        """How many CPUs' worth of time this process may use: its CPUs, or its quota if less."""
        n = float(len(self.ids))
        return min(n, self.quota) if self.quota is not None else n

    @property
    def threads(self) -> int:
        """Threads for a quiet machine: one per physical core, within the quota (at least one)."""
        return max(1, min(self.cores, math.floor(self.capacity)))

    @property
    def restricted(self) -> bool:
        """Does the affinity mask or the quota leave this process fewer threads than torch's
        default (one per physical core of the whole machine) would take?"""
        whole = self.online is None or len(self.ids) >= self.online
        return not whole or (self.quota is not None and self.quota < self.cores)

    def describe(self) -> str:
        """``2 CPUs`` / ``4 CPUs (2 cores), quota 1.5``."""
        text = f"{len(self.ids)} CPU{'s' if len(self.ids) != 1 else ''}"
        if self.cores != len(self.ids):
            text += f" ({self.cores} core{'s' if self.cores != 1 else ''})"
        if self.online is not None and len(self.ids) < self.online:
            text += f" of {self.online}"
        if self.quota is not None:
            text += f", cgroup quota {self.quota:g} CPUs"
        return text


def machine_cpus() -> Cpus:
    """The CPUs this process may use on this machine (affinity, physical cores, cgroup quota)."""
    try:
        ids = tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        ids = tuple(range(os.cpu_count() or 1))
    return Cpus(ids, physical_cores(ids), cgroup_cpu_quota(), os.cpu_count())


# ---------------------------------------------------------------------------- the load
@dataclass(frozen=True)
class Load:
    """What other processes kept busy over a while.

    Attributes:
        others: CPUs' worth of time the others used (1.0: one CPU busy all along).
        seconds: how long the look was.
    """

    others: float
    seconds: float

    @staticmethod
    def between(before: StatSample, after: StatSample) -> Load:
        """The others' load from two readings: the CPUs' busy time minus this process's own."""
        dt = after.t - before.t
        if dt <= 0:
            raise ValueError(f"after: expected a reading later than before, got dt={dt:g} s")
        others = (after.busy - before.busy) - (after.own - before.own)
        return Load(max(others / dt, 0.0), dt)

    @property
    def busy_cpus(self) -> int:
        """The others' load in whole CPUs (:data:`BUSY_CPU` and up counts as one)."""
        return math.floor(self.others + 1.0 - BUSY_CPU)


def others_load(
    cpus: Iterable[int] | None, look: float = LOOK_S, stat: str | os.PathLike | None = None
) -> Load | None:
    """The others' load on ``cpus`` over ``look`` seconds of sleep, from two readings of
    ``stat`` (procfs's, :func:`read_stat`) with this process's own CPU time taken out (None where it cannot
    be read)."""
    cpus = None if cpus is None else list(cpus)
    before = read_stat(cpus, stat)
    if before is None:
        return None
    time.sleep(look)
    after = read_stat(cpus, stat)
    return Load.between(before, after) if after is not None else None


# ---------------------------------------------------------------------------- the choice
@dataclass(frozen=True)
class ThreadChoice:
    """How torch's CPU threads run in this process, and why.

    Attributes:
        threads: torch's intra-op threads (None: torch's default, one per physical core).
        wait_policy: ``OMP_WAIT_POLICY`` (None: libgomp's default, spin a while then sleep).
        reason: why, in words.
        automatic: the thread count is qkv's to follow (a long run's :class:`LoadWatch` may
            change it); False when the user set it, or the choice was turned off.
        env: the variables to set before torch loads.
        cpus: the CPUs it was chosen for; ``load`` the load it saw (None: not measured).
        applied: the environment was set before torch loaded (see :func:`configure_threads`).
    """

    threads: int | None
    wait_policy: str | None
    reason: str
    automatic: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    cpus: Cpus | None = None
    load: Load | None = None
    applied: bool = True
    invalid: tuple[str, ...] = ()
    given_by: str | None = None

    def describe(self) -> str:
        """One line: the thread count (as torch runs it, once torch is loaded), the wait, and
        why."""
        running = torch_threads() if self.applied else None
        n = running if running is not None else self.threads
        count = "torch's default" if n is None else str(n)
        if self.cpus is not None:
            count += f" {'on' if n is None else 'of'} {self.cpus.describe()}"
        wait = self.wait_policy or "the default (spin a while, then sleep)"
        return f"threads: {count}, OpenMP wait: {wait} ({self.reason})"

    def warnings(self) -> list[str]:
        """One line per thread count of the user's that is not used as given, or not well: a
        variable that is not a count (replaced by qkv's choice), and once torch is loaded, a
        count torch does not run (it caps its threads) and more threads running than the CPUs
        this process may use (they take turns on them: slower, not faster)."""
        lines = list(self.invalid)
        running = torch_threads() if self.applied else None
        if self.given_by and self.threads is not None and running not in (None, self.threads):
            lines.append(
                f"{self.given_by}={self.threads} was not honoured: torch runs "
                f"{thread_count(running)}"  # type: ignore[arg-type]
            )
        if self.given_by and self.cpus is not None and running is not None:
            room = max(1, math.ceil(self.cpus.capacity - 1e-9))
            if running > room:
                lines.append(
                    f"{self.given_by}={self.threads}: {thread_count(running)} on the "
                    f"{self.cpus.describe()} this process may use take turns on them, slower "
                    f"than {room} would be"
                )
        return lines


def thread_count(n: int) -> str:
    """``"1 thread"``, ``"4 threads"``."""
    return f"{n} thread{'' if n == 1 else 's'}"


def torch_threads() -> int | None:
    """The intra-op threads torch runs (``torch.get_num_threads()``), None while torch is not
    loaded (asking would load it)."""
    torch = sys.modules.get("torch")
    get = getattr(torch, "get_num_threads", None)
    return int(get()) if callable(get) else None


def _user_vars(env: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The variables of ``names`` set in ``env`` by the user (not by qkv: :data:`MARK_VAR`)."""
    ours = dict(item.split("=", 1) for item in env.get(MARK_VAR, "").split(";") if "=" in item)
    return {n: env[n] for n in names if n in env and ours.get(n) != env[n]}


def _count(value: str, name: str = "") -> int | None:
    """The thread count ``value`` of variable ``name`` asks for, None when it is none.
    ``OMP_NUM_THREADS`` may be OpenMP's list of counts per nesting level (``4,2``): the
    first is the one torch's threads follow."""
    parts = value.split(",") if name == "OMP_NUM_THREADS" else [value]
    counts = []
    for part in parts:
        try:
            counts.append(int(part.strip()))
        except ValueError:
            return None
    return counts[0] if min(counts) >= 1 else None


def auto_threads(cpus: Cpus, load: Load | None) -> int:
    """One thread per CPU the others leave free (of :attr:`Cpus.threads`), at least one."""
    if load is None:
        return cpus.threads
    free = math.floor(cpus.capacity + 1.0 - BUSY_CPU - load.others)  # rounded, 0.5 up
    return max(1, min(cpus.threads, free))


def choose(
    cpus: Cpus, load: Load | None, env: Mapping[str, str], threads: int | None = None
) -> ThreadChoice:
    """The thread count and wait policy for ``cpus`` under ``load`` (pure: nothing is timed,
    read or set).

    Args:
        cpus: the CPUs this process may use.
        load: the others' load on them (None: unknown, taken as quiet).
        env: the environment (the user's ``OMP_*``/``GOMP_*``/``KMP_*``/``MKL_*`` win).
        threads: a thread count the user gave (``--threads``; None or 0: none).
    """
    if env.get(OFF_VAR, "").strip().lower() in ("0", "off", "no", "false"):
        return ThreadChoice(None, None, f"{OFF_VAR}={env[OFF_VAR]}: left to torch and OpenMP")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)):
        raise TypeError(f"threads: expected an int or None, got {threads!r}")
    user_wait = _user_vars(env, WAIT_VARS)
    user_threads = _user_vars(env, THREAD_VARS)
    given = threads if threads else None
    given_by = "--threads" if given else None
    bad = {name: value for name, value in user_threads.items() if _count(value, name) is None}
    for name, value in user_threads.items():
        if given is None and name not in bad:
            given, given_by = _count(value, name), name
    busy = load is not None and load.busy_cpus > 0
    seen = (
        f"others kept {load.others:.1f} CPUs busy over {load.seconds:.1f} s"
        if load is not None
        else "the load could not be read"
    )
    new_env: dict[str, str] = {}
    if given is not None:
        n, automatic = given, False
        why = f"{given_by} given"
    else:
        n, automatic = auto_threads(cpus, load), True
        if busy:
            why = f"{seen}: one thread per free CPU"
        elif cpus.restricted:
            why = f"{seen}, quiet: one thread per core this process may use"
        else:
            why = f"{seen}, quiet: torch's default"
        if busy or cpus.restricted or bad:
            new_env["OMP_NUM_THREADS"] = str(n)
        else:
            n = None  # torch's own default: nothing changes on a quiet machine
    invalid = []
    for name, value in bad.items():  # replaced: OpenMP and MKL never read a value that is not one
        use = given if given is not None else n
        new_env[name] = str(use)
        invalid.append(
            f"{name}={value!r} is not a thread count (expected a whole number >= 1): "
            f"ignored, {thread_count(use)} used instead ({why})"  # type: ignore[arg-type]
        )
    wait = None
    if user_wait:
        name, value = next(iter(user_wait.items()))
        wait = value if name == "OMP_WAIT_POLICY" else f"as {name}={value} says"
        why += f"; {name}={value} given"
    elif busy and n is not None and n > auto_threads(cpus, load):
        wait = "PASSIVE"
        new_env["OMP_WAIT_POLICY"] = wait
        why += f"; {seen}, fewer CPUs free than threads: they sleep while they wait"
    return ThreadChoice(
        n, wait, why, automatic, new_env, cpus, load, invalid=tuple(invalid), given_by=given_by
    )


_CHOSEN: ThreadChoice | None = None


def current_choice() -> ThreadChoice | None:
    """What :func:`configure_threads` chose in this process (None before it ran)."""
    return _CHOSEN


def configure_threads(
    threads: int | None = None,
    *,
    look: float = LOOK_S,
    environ: MutableMapping[str, str] | None = None,
) -> ThreadChoice:
    """Choose torch's threads from this machine's state and set the environment for it.

    Reads the CPUs this process may use (:func:`machine_cpus`) and the others' load over
    ``look`` seconds (:func:`others_load`), chooses (:func:`choose`) and sets the variables
    of the choice in ``environ`` (``os.environ``), where OpenMP reads them when torch loads.
    Once torch is loaded nothing is set (``applied`` is False): call it before ``import torch``.

    Args:
        threads: a thread count the user gave (``--threads``), which wins; None or 0: none.
        look: seconds to watch the load for (0: do not look; taken as quiet).
        environ: the environment to read and set (``os.environ``).

    Returns:
        The :class:`ThreadChoice`, also kept for :func:`current_choice`.
    """
    global _CHOSEN
    if isinstance(look, bool) or not isinstance(look, (int, float)) or not 0 <= look <= 10:
        raise ValueError(f"look: expected seconds in [0, 10], got {look!r}")
    env = os.environ if environ is None else environ
    cpus = machine_cpus()
    if env.get(OFF_VAR, "").strip().lower() in ("0", "off", "no", "false"):
        load = None
    else:
        load = others_load(cpus.ids, look) if look > 0 else None
    choice = choose(cpus, load, env, threads)
    if "torch" in sys.modules:
        why = "torch was loaded before qkv could choose: threads and waiting left as they are"
        choice = ThreadChoice(None, None, why, cpus=cpus, load=load, applied=False)
    elif choice.env:
        env.update(choice.env)
        env[MARK_VAR] = ";".join(f"{k}={v}" for k, v in choice.env.items())
    _CHOSEN = choice
    return choice


# ---------------------------------------------------------------------------- long runs
class LoadWatch:
    """Re-reads the others' load now and then, for a long run whose thread count is automatic.

    :meth:`poll` is cheap between checks (a clock reading); every :attr:`EVERY_S` seconds it
    reads the kernel's CPU times (the load since the last check, this process's own time taken out) and
    returns a new thread count when two checks in a row agree on one that differs from the
    current (``torch.set_num_threads`` clears oneDNN's primitive cache: rarely, not on a blip).

    Args:
        cpus: the CPUs this process may use.
        threads: the thread count now.
        every: seconds between checks.
        stat: the CPU times' file (None: procfs's); ``clock``: the time source (for tests).
    """

    EVERY_S = 30.0

    def __init__(
        self,
        cpus: Cpus,
        threads: int,
        *,
        every: float = EVERY_S,
        stat: str | os.PathLike | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads: expected an int >= 1, got {threads!r}")
        if not every > 0:
            raise ValueError(f"every: expected seconds > 0, got {every!r}")
        self.cpus, self.threads, self.every = cpus, threads, every
        self.stat, self.clock = stat, clock
        self.pending: int | None = None
        self.last = read_stat(cpus.ids, stat, now=clock())
        self.last_load: Load | None = None

    def poll(self) -> int | None:
        """The thread count to switch to now, or None (most calls: not time to check yet)."""
        now = self.clock()
        if self.last is None or now - self.last.t < self.every:
            return None
        sample = read_stat(self.cpus.ids, self.stat, now=now)
        if sample is None:
            return None
        return self.observe(Load.between(self.last, sample), sample)

    def observe(self, load: Load, sample: StatSample | None = None) -> int | None:
        """Take ``load`` as the latest check's; the new thread count once two checks agree."""
        if sample is not None:
            self.last = sample
        self.last_load = load
        target = auto_threads(self.cpus, load)
        if target == self.threads:
            self.pending = None
            return None
        if self.pending != target:
            self.pending = target
            return None
        self.threads, self.pending = target, None
        return target

    @classmethod
    def for_this_process(cls, threads_fixed: bool = False, **kwargs: object) -> LoadWatch | None:
        """A watch when this process's thread count is qkv's automatic choice (see
        :func:`configure_threads`) and ``threads_fixed`` is False; else None."""
        choice = _CHOSEN
        if threads_fixed or choice is None or not choice.automatic or choice.cpus is None:
            return None
        if not choice.applied:
            return None
        import torch

        return cls(choice.cpus, torch.get_num_threads(), **kwargs)  # type: ignore[arg-type]


def _switch(before: int, after: int, load: Load | None) -> str:
    busy = f": others keep {load.others:.1f} CPUs busy" if load is not None else ""
    return f"threads: {before} -> {after}{busy}"


def follow(watch: LoadWatch | None, say: Callable[[str], None] | None = None) -> None:
    """Poll ``watch`` (None: nothing) and switch torch's thread count in this thread when it
    says so; ``say`` (``log.info``) tells why."""
    if watch is None:
        return
    n = watch.poll()
    if n is None:
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    (say or log.info)(_switch(before, n, watch.last_load))


def follow_in_background(
    watch: LoadWatch | None, apply: Callable[[int], object]
) -> threading.Thread | None:
    """Poll ``watch`` from a daemon thread every ``watch.every`` seconds, and call ``apply(n)``
    to switch to ``n`` threads in the thread that computes (``torch.set_num_threads`` sets the
    calling thread's count: a server hands it to its worker). Returns the thread (None for no
    ``watch``)."""
    if watch is None:
        return None

    def loop() -> None:
        while True:
            time.sleep(watch.every)
            before = watch.threads
            n = watch.poll()
            if n is None:
                continue
            try:
                apply(n)
            except Exception as e:  # the worker is stopping, or its queue full: next time
                watch.threads = before
                log.debug("threads: could not switch to %d: %s", n, e)
                continue
            log.info("%s", _switch(before, n, watch.last_load))

    thread = threading.Thread(target=loop, name="qkv-threads", daemon=True)
    thread.start()
    return thread
