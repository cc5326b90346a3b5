"""Executors: run tasks, yield results as they finish, and never leave anything behind.

``serial`` runs in this process. ``processes`` is a local process pool (forkserver where
available, else spawn: children never inherit the caller's threads or state). Dask runs on
a local cluster (``"dask"``), a scheduler address (``"dask://HOST:PORT"``) or a
``distributed.Client``; any :class:`concurrent.futures.Executor` works too. The process pool
lives as long as the caller's stack: a choice's rounds and a sweep's waves reuse its workers.

``processes`` is the standard library's pool; what is written here around it (the
lifeline, the retries, the guard check) is kept because neither the bare pool nor loky
gives the promises below (``docs/internals.md`` has the comparison, ``benchmarks/executors.py``
measures it).

Guarantees:

* Interrupts (Ctrl-C): finished results are handed to ``rescue`` (and so reach the cache)
  and the rest are cancelled; with ``processes`` the running solves end at once (the
  lifeline is closed: every worker exits). The workers themselves ignore SIGINT (a
  terminal's Ctrl-C and a kernel interrupt reach the whole process group): the parent alone
  decides, and its ``KeyboardInterrupt`` is the sweep's.
* A worker process that dies (a native crash in the solver) only fails its points: the
  pool is rebuilt and they are retried up to :data:`MAX_ATTEMPTS` times. If the caller's
  main module is a script without an ``if __name__ == "__main__":`` guard (every spawned
  worker imports it again and dies starting a sweep of its own), the error rows say so at
  the first death instead of blaming the solver.
* If the sweeping process itself dies (even ``SIGKILL``), its workers notice within
  moments (each watches a pipe only the parent holds open) and exit; the fork server and
  multiprocessing's resource tracker then exit on their own. Nothing keeps solving for a
  result nobody will read.
* A Dask scheduler that does not answer within :data:`DASK_CONNECT_SECONDS` is an error
  at once, naming the address.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures import as_completed as futures_as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack
from functools import partial
from typing import Any, NoReturn

from sapptk.checks import MAX_ATTEMPTS, MAX_SOLVER_WORKERS, show
from sapptk.errors import ConfigError, SapptkError
from sapptk.sweeps.solving import PointResult, Solve, SweepTask, no_plan, portable, timed

__all__ = [
    "DASK_CONNECT_SECONDS",
    "MAX_ATTEMPTS",
    "MAX_SOLVER_WORKERS",
    "Runner",
    "available_cores",
    "check_executor",
    "default_workers",
    "open_executor",
]

DASK_CONNECT_SECONDS = 5.0
"""How long a sweep waits for a Dask scheduler to answer before giving up."""

Rescue = Callable[[PointResult], None]
Runner = Callable[[Sequence[SweepTask], Rescue], Iterator[PointResult]]


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers(slots: int, cores: int | None = None) -> int:
    """CP-SAT workers per solve when ``slots`` solves run at once on ``cores`` cores.

    ``slots × workers`` stays within the cores: serial gets them all (at most
    :data:`MAX_SOLVER_WORKERS`), a pool of one process per core gets 1 each.
    """
    cores = cores or available_cores()
    return max(1, min(MAX_SOLVER_WORKERS, cores // max(1, slots)))


# ------------------------------------------------------------------------------ serial
def _run_serial(tasks: Sequence[SweepTask], solve: Solve) -> Iterator[PointResult]:
    for task in tasks:
        yield timed(solve, task)


# ----------------------------------------------------------------------------- futures
def _future_result(fut: Future, task: SweepTask) -> PointResult:
    """A finished future's result, or an ``error`` row if the worker failed."""
    try:
        return fut.result()
    except Exception as exc:  # a dead worker process, a cancelled task, ...
        return no_plan(task.key, "error", f"{type(exc).__name__}: {exc}")


def _run_futures(
    tasks: Sequence[SweepTask],
    submit: Callable[[SweepTask], Any],
    as_completed: Callable[[list[Any]], Iterable[Any]],
    cancel: Callable[[list[Any]], None],
    rescue: Rescue,
    broken: list[SweepTask] | None = None,
) -> Iterator[PointResult]:
    """Submit every task, yield results as they finish; on interrupt, hand finished results to
    ``rescue`` and cancel the rest. With ``broken``, tasks lost to a dead process pool go
    there instead of becoming ``error`` rows (the caller retries them)."""
    futures = {submit(task): task for task in tasks}
    done: set[Any] = set()
    try:
        for fut in as_completed(list(futures)):
            done.add(fut)
            if broken is not None and isinstance(fut.exception(), BrokenProcessPool):
                broken.append(futures[fut])
                continue
            yield _future_result(fut, futures[fut])
    finally:
        pending = [f for f in futures if f not in done]
        if pending:
            for fut in pending:
                if fut.done():
                    result = _future_result(fut, futures[fut])
                    if result.status != "error":
                        rescue(result)
            cancel([f for f in pending if not f.done()])


def _cancel(pending: list[Future]) -> None:
    for f in pending:
        f.cancel()


def _ignore(pending: list[Future]) -> None:
    """No cancelling: closing the lifeline ends the pool as a whole (:class:`_ProcessRunner`)."""


def _run_pool(tasks: Sequence[SweepTask], solve: Solve, pool: Executor, rescue: Rescue) -> Iterator[PointResult]:
    return _run_futures(tasks, lambda t: pool.submit(timed, solve, t), futures_as_completed, _cancel, rescue)


# --------------------------------------------------------------------------- processes
def _pool_context() -> multiprocessing.context.BaseContext:
    """forkserver where available, else spawn: children never inherit the caller's threads
    or state (a notebook's included). The fork server imports the solver stack once, so
    later pools start in milliseconds rather than seconds."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        # the solver stack too: each new pool's workers then start solving at once
        ctx.set_forkserver_preload(["sapptk.sweeps", "sapptk.balancer", "sapptk.solver.search", "sapptk.plan"])
        return ctx
    return multiprocessing.get_context("spawn")


def _start_fork_server(ctx: multiprocessing.context.BaseContext) -> None:
    """Start the fork server (if that is the method and it is not running) with SIGINT blocked,
    as the standard library starts its resource tracker: a Ctrl-C reaches the whole process
    group, and one arriving while the server imports its preloads would kill it with a
    traceback. Blocked, it stays pending here and is raised once the server is up."""
    if ctx.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    blocked = hasattr(signal, "pthread_sigmask")
    if blocked:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        forkserver.ensure_running()
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _watch_parent(lifeline: Any) -> None:
    """Pool initializer: exit this worker when the sweeping process dies.

    ``lifeline`` is the read end of a pipe whose only write end the parent holds: reading
    it blocks until the parent closes it or dies (even by ``SIGKILL``), and then gives EOF.
    CP-SAT releases the GIL while it solves, so the watching thread runs meanwhile.
    """

    # Ctrl-C (a kernel interrupt reaches the whole process group) is the parent's to handle: it
    # closes the lifeline, and every worker exits; a worker of its own would die mid-solve with a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        try:
            while True:
                lifeline.recv_bytes()
        except (EOFError, OSError):
            os._exit(70)  # no cleanup: the parent is gone, nobody waits for anything we hold

    threading.Thread(target=watch, name="sapptk-lifeline", daemon=True).start()


def unguarded_main() -> str | None:
    """The caller's main script when it has no ``if __name__ == "__main__":`` guard (None when
    it has one, or when the main module is not a script: a notebook, the REPL, ``-c``)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py") or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test):
            return None
    return path


def _is_main_test(test: ast.expr) -> bool:
    if isinstance(test, ast.BoolOp):
        return any(_is_main_test(v) for v in test.values)
    if not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return False
    sides = [test.left, test.comparators[0]]
    names = any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
    main = any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)
    return names and main


def _death_reason(method: str, attempts: int) -> tuple[str, bool]:
    """Why worker processes died, and whether retrying can help."""
    script = unguarded_main() if method in ("spawn", "forkserver") else None
    if script is not None:
        return (
            f"the worker processes died at start: {script} has no `if __name__ == \"__main__\":` guard, and with "
            f"the {method} start method every worker imports it again (and so starts a sweep of its own). Put the "
            "code that calls sweep() under that guard",
            False,
        )
    return (f"the worker process died {attempts} times while this point was running (a crash in the solver, or "
            "the machine ran out of memory?)", True)


class _ProcessRunner:
    """A local process pool kept from one call to the next (a choice's rounds, a sweep's waves):
    its workers are forked once, not once per round. If a process dies (a native crash in a
    solver), the pool breaks: its unfinished points go to a fresh pool, up to
    :data:`~sapptk.checks.MAX_ATTEMPTS` times each. The lifeline is also the kill switch:
    closing its write end (on an interrupt, or by :meth:`close` at the end) makes every
    worker exit at once, running solves included, with no private attribute of the pool."""

    def __init__(self, solve: Solve, slots: int) -> None:
        self.solve, self.slots = solve, max(1, slots)
        self.ctx = _pool_context()
        self.pool: ProcessPoolExecutor | None = None
        self.lifeline: tuple[Any, Any] | None = None  # (read end: workers, write end: this process)

    def __call__(self, tasks: Sequence[SweepTask], rescue: Rescue) -> Iterator[PointResult]:
        tries: dict[str, int] = {}
        queue = list(tasks)
        while queue:
            pool = self._open()
            broken: list[SweepTask] = []
            try:
                yield from _run_futures(queue, partial(pool.submit, timed, self.solve), futures_as_completed,
                                        _ignore, rescue, broken)
            except BaseException:  # an interrupt (or the caller closed this early): stop the running solves too
                self.close(wait=False)  # every worker exits now; the pool then fails its pending futures itself
                raise
            if broken:
                self.close()  # a dead worker broke the pool: the retries get a fresh one
            queue = []
            for task in broken:
                n = tries[task.key] = tries.get(task.key, 0) + 1
                reason, retry = _death_reason(self.ctx.get_start_method(), n)
                if retry and n < MAX_ATTEMPTS:
                    queue.append(task)
                else:
                    yield no_plan(task.key, "error", reason)

    def _open(self) -> ProcessPoolExecutor:
        if self.pool is None:
            _start_fork_server(self.ctx)
            read, write = self.ctx.Pipe(duplex=False)  # workers read; only this process writes
            self.lifeline = (read, write)
            self.pool = ProcessPoolExecutor(max_workers=self.slots, mp_context=self.ctx, initializer=_watch_parent,
                                            initargs=(read,))
        return self.pool

    def close(self, wait: bool = True) -> None:
        """End the workers (closing the lifeline ends even running solves) and the pool."""
        if self.pool is None or self.lifeline is None:
            return
        read, write = self.lifeline
        write.close()
        self.pool.shutdown(wait=wait)
        read.close()
        self.pool, self.lifeline = None, None


# -------------------------------------------------------------------------------- Dask
def _is_dask_client(executor: Any) -> bool:
    return type(executor).__name__ == "Client" and type(executor).__module__.startswith("distributed")


def _dask_client(executor: str, n: int, stack: ExitStack) -> Any:
    """A Dask client for ``"dask"`` (a local cluster of ``n`` workers) or ``"dask://HOST:PORT"``."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ConfigError(f"executor = {executor!r}: Dask is not installed (pip install sapptk[distributed])") from None
    if executor == "dask":
        cluster = stack.enter_context(LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                                   dashboard_address=None))
        return stack.enter_context(Client(cluster))
    address = executor.removeprefix("dask://")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"executor = {executor!r}: expected 'dask://HOST:PORT' with a port from 1 to 65535")
    try:
        return stack.enter_context(Client("tcp://" + address, timeout=DASK_CONNECT_SECONDS))
    except (OSError, TimeoutError) as exc:
        raise SapptkError(
            f"executor = {executor!r}: no Dask scheduler answered at tcp://{address} within {DASK_CONNECT_SECONDS:g} "
            f"s ({type(exc).__name__}): start one (`dask scheduler`) or check the address"
        ) from None


def _run_dask(tasks: Sequence[SweepTask], solve: Solve, client: Any, rescue: Rescue) -> Iterator[PointResult]:
    from distributed import as_completed

    def submit(task: SweepTask) -> Any:
        return client.submit(timed, solve, task, pure=False, key=f"sapptk-sweep-{task.key}-{uuid.uuid4().hex[:8]}")

    return _run_futures(tasks, submit, as_completed, client.cancel, rescue)


# ---------------------------------------------------------------------------- choosing
def open_executor(
    executor: Any, todo: Sequence[SweepTask], solve: Solve, workers: int | None, stack: ExitStack
) -> tuple[Runner, int]:
    """A runner for the executor (closed by ``stack``) and how many solves it runs at once.

    Unknown executors and unreachable schedulers raise here, before anything is solved.
    """
    n_cores = available_cores()
    check_executor(executor)
    if executor == "serial" or not todo:
        return (lambda tasks, rescue: _run_serial(tasks, solve)), 1
    if executor == "processes":
        slots = max(1, min(len(todo), n_cores // workers if workers else n_cores))
        runner = _ProcessRunner(portable(solve), slots)  # kept for every call, closed with the stack
        stack.callback(runner.close)
        return runner, slots
    if isinstance(executor, str) and (executor == "dask" or executor.startswith("dask://")):
        executor = _dask_client(executor, max(1, min(len(todo), n_cores // workers if workers else n_cores)), stack)
    if _is_dask_client(executor):
        slots = sum(executor.nthreads().values()) or 1
        return (lambda tasks, rescue: _run_dask(tasks, solve, executor, rescue)), slots
    if isinstance(executor, Executor):
        slots = getattr(executor, "_max_workers", None) or n_cores
        shipped = portable(solve)
        return (lambda tasks, rescue: _run_pool(tasks, shipped, executor, rescue)), slots
    _unknown(executor)


def check_executor(executor: Any) -> None:
    """Refuse an executor no runner exists for (before anything else is set up)."""
    if isinstance(executor, str):
        if executor not in ("serial", "processes", "dask") and not executor.startswith("dask://"):
            _unknown(executor)
    elif not (_is_dask_client(executor) or isinstance(executor, Executor)):
        _unknown(executor)


def _unknown(executor: Any) -> NoReturn:
    raise ConfigError(
        f"executor = {show(executor, 80)}: expected 'serial', 'processes', 'dask', "
        "'dask://HOST:PORT', a distributed.Client or a concurrent.futures.Executor"
    )
