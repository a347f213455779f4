"""The measurement process: profiling jobs measure in a Python process of their own.

Snakemake runs the profiling rules in threads of its own process (so that torch is
imported and CUDA started once per run, not once per job). Measuring *in* one of those
threads shares the interpreter with Snakemake: its lock (the GIL), which a measurement
that launches kernels from Python needs for every operation, and its garbage collector.
On an H100, in a study of 1,140 jobs, one op's timed blocks then varied tenfold (median
max/min 10.8, coefficient of variation 0.55, against 0.20 in a study of 356 jobs), and
whole networks ran 2 to 12 times slower than alone, so the ops' sum missed the network by
-59 % to +430 %.

So a job hands its measurement to a worker: one ``python -m opcost.worker`` process per
Snakemake process, started by the first job and reused by the next ones (torch and CUDA
still start once). The job's thread waits for the answer without holding the GIL. The
worker runs each request in its main thread, where SIGTERM unwinds the job (loggers
stopped, GPU setting restored, nothing half-written left).

Protocol: length-prefixed pickles over the worker's stdin and a copy of its stdout (its
file descriptor 1 then points at stderr, so that anything the measured code prints
cannot corrupt an answer). A request is ``(function, kwargs)``, ``function`` named
``"opcost.module:name"``; an answer is ``("ok", result)`` or ``("error", exception)``.
The worker exits when its stdin closes or its parent dies. It ignores SIGINT: when
Snakemake is interrupted, its handler (:func:`stop_on_interrupt`) stops the measurement
with SIGTERM, also when the SIGINT went to Snakemake alone. A SIGTERM to Snakemake
(``scancel``, a time limit) does the same (:func:`stop_on_terminate`). Once stopped, a
process's worker takes no further request.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from opcost.errors import OpcostError

_HEADER = struct.Struct("!Q")
#: How often the worker checks, during a job, whether its parent is still alive (s).
PARENT_CHECK_S = 1.0


class WorkerError(OpcostError, RuntimeError):
    """The measurement worker failed: it died, or its answer cannot be read."""


class RemoteError(OpcostError, RuntimeError):
    """An exception raised in the worker that could not be sent back as it was."""


def _write_frame(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_frame(stream: IO[bytes]) -> Any:
    """The next object, or raise EOFError if the stream ends (before or inside a frame)."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def _resolve(function: str) -> Any:
    module, _, name = function.partition(":")
    if not (module == "opcost" or module.startswith("opcost.")) or not name:
        raise ValueError(f"the worker runs opcost functions ('opcost.x:name'), not {function!r}")
    return getattr(importlib.import_module(module), name)


class Worker:
    """The client side: one worker process, started on first use, one request at a time."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._interrupted = False

    @property
    def pid(self) -> int | None:
        """The running worker's process id, None if none runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def call(self, function: str, **kwargs: Any) -> Any:
        """Run ``function(**kwargs)`` in the worker and return its result.

        Raises:
            Exception: what the function raised, with the worker's traceback as a note.
            WorkerError: the worker died before answering (it is restarted next call).
        """
        with self._lock:
            if self._interrupted:
                raise WorkerError(
                    f"measurement not started ({function}): Snakemake was interrupted; "
                    "no raw log was written, rerun the same command"
                )
            proc = self._running()
            if self._interrupted:
                # The signal came while the worker started, before interrupt() could see it.
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGTERM)
            try:
                _write_frame(proc.stdin, (function, kwargs))
                status, value = _read_frame(proc.stdout)
            except (EOFError, BrokenPipeError, OSError) as e:
                code = self._reap()
                if self._interrupted:
                    raise WorkerError(
                        f"measurement stopped (pid {proc.pid}, {function}): Snakemake was "
                        "interrupted; no raw log was written, rerun the same command"
                    ) from e
                raise WorkerError(
                    f"the measurement worker (pid {proc.pid}) exited with code {code} while "
                    f"running {function}; its own messages went to this Snakemake process's "
                    f"stderr (the console, or the SLURM job's output file)"
                ) from e
        if status == "ok":
            return value
        raise value

    def _running(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._reap()
        env = dict(os.environ)
        # Where this opcost came from, first: also when it is not installed (tests, -e).
        source = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "opcost.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        return self._proc

    def _reap(self, timeout_s: float = 10) -> int | None:
        """Close the worker's pipes (it exits after its request) and wait; its exit code."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def interrupt(self) -> None:
        """Stop the running measurement: SIGTERM unwinds it in the worker (no raw log left).

        Called from a signal handler, so it takes no lock: the job's thread holds it while
        it waits for the answer, which then fails with a :class:`WorkerError`. Later
        calls fail at once: a process told to stop measures nothing more.
        """
        self._interrupted = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGTERM)

    def close(self) -> None:
        """Stop the worker: close its stdin, so it exits after the request it runs."""
        with self._lock:
            self._reap(timeout_s=30)


_SHARED = Worker()
atexit.register(_SHARED.close)


def call(function: str, **kwargs: Any) -> Any:
    """Run ``function(**kwargs)`` in this process's shared measurement worker."""
    return _SHARED.call(function, **kwargs)


_PREVIOUS_SIGINT: Any = None


def _on_sigint(signum: int, frame: Any) -> None:
    _SHARED.interrupt()
    if callable(_PREVIOUS_SIGINT):
        _PREVIOUS_SIGINT(signum, frame)
    else:
        raise KeyboardInterrupt


def stop_on_interrupt() -> bool:
    """Make SIGINT to this process also stop the measurement running in its worker.

    The worker ignores SIGINT (a Ctrl-C reaches it too): otherwise a SIGINT to Snakemake
    alone leaves the worker measuring, and a job Snakemake gave up on writes its raw logs
    afterwards. The handler then does what SIGINT did before (Snakemake: KeyboardInterrupt,
    it stops scheduling). Installed from the main thread only, and not where SIGINT is
    ignored (a background process); returns whether it is installed.
    """
    global _PREVIOUS_SIGINT
    if threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGINT)
    if current is _on_sigint:
        return True
    if current is signal.SIG_IGN:
        return False
    _PREVIOUS_SIGINT = current
    signal.signal(signal.SIGINT, _on_sigint)
    return True


#: In a batch (Snakemake's remote mode, one SLURM job), how long the process may still
#: run after a SIGTERM before it ends itself, whatever still runs (s).
BATCH_EXIT_AFTER_SIGTERM_S = 5.0

# What the SIGTERM handler leaves to threads of their own (:func:`_run_later`): what
# takes a lock (a handler runs in the main thread, which may hold that lock), and the
# batch's deadline. SimpleQueue.put is safe in a signal handler.
_LATER: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_DEADLINE: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_threads_started = False
_exit_after_s: float | None = None


def _run_later(todo: queue.SimpleQueue[Callable[[], None]]) -> None:
    while True:
        todo.get()()


def _exit_soon() -> None:
    """End the process ``_exit_after_s`` after a SIGTERM, if it has not ended by then."""
    if _exit_after_s is None:
        return
    time.sleep(_exit_after_s)
    message = (
        f"opcost: still running {_exit_after_s:g} s after SIGTERM; ending this batch "
        f"(pid {os.getpid()}) now\n"
    )
    with contextlib.suppress(OSError):
        os.write(2, message.encode())
    os._exit(128 + signal.SIGTERM)


def _exit_gracefully(scheduler: Any, *args: Any) -> None:
    """Snakemake's SIGTERM handler (``JobScheduler.exit_gracefully``), made safe.

    Snakemake's own takes the scheduler's lock; the handler runs in the main thread,
    which holds that lock while it selects jobs (the ILP solver runs as a subprocess
    under it) and while it finishes them. A SIGTERM then waits forever for a lock its
    own thread holds: the process stays, idle, and ignores further SIGTERMs. This one
    takes no lock: it stops the measurement, sets the flag (one assignment) on which the
    scheduler starts nothing more and ends once the running jobs have, and wakes the
    scheduler from another thread.
    """
    _SHARED.interrupt()
    scheduler._user_kill = "graceful"
    _LATER.put(scheduler._open_jobs.release)
    _DEADLINE.put(_exit_soon)


class SignalSetupError(OpcostError, RuntimeError):
    """Snakemake's SIGTERM handling is not the one :func:`stop_on_terminate` replaces."""


def stop_on_terminate(exit_after_s: float | None = None) -> None:
    """Make SIGTERM to this Snakemake process stop its measurement and then Snakemake.

    Replaces Snakemake's SIGTERM handler (checked against Snakemake 9.27.1) with
    :func:`_exit_gracefully`: the measurement running in the worker stops at once (SIGTERM:
    it unwinds, restores the GPU setting and leaves no raw log), no further measurement
    starts, jobs of other rules still running finish, and Snakemake ends.

    Args:
        exit_after_s: end the process this long after a SIGTERM if it still runs. For a
            batch: on a cluster that tracks processes without cgroups
            (proctrack/linuxproc) a process whose parent shell died on SIGTERM is out of
            SLURM's reach, and SLURM's SIGKILL after KillWait never comes.

    Raises:
        SignalSetupError: Snakemake's scheduler lacks what the handler relies on.
    """
    global _threads_started, _exit_after_s
    import inspect

    import snakemake
    from snakemake.scheduling import job_scheduler

    scheduler_class = job_scheduler.JobScheduler
    current = getattr(scheduler_class, "exit_gracefully", None)
    if current is not _exit_gracefully:
        source = inspect.getsource(current) if callable(current) else ""
        init = inspect.getsource(scheduler_class.__init__)
        if not (
            "_user_kill" in source
            and "_open_jobs.release" in source
            and "signal.SIGTERM, self.exit_gracefully" in init
        ):
            raise SignalSetupError(
                f"opcost cannot stop profiling safely on SIGTERM with Snakemake "
                f"{getattr(snakemake, '__version__', 'unknown')}: its JobScheduler handles "
                "SIGTERM differently (opcost.worker was checked against Snakemake 9.27.1); "
                "install a Snakemake 9 (pip install 'snakemake>=9,<10')"
            )
        scheduler_class.exit_gracefully = _exit_gracefully
    _exit_after_s = exit_after_s
    if not _threads_started:
        _threads_started = True
        for name, todo in (("opcost-sigterm", _LATER), ("opcost-sigterm-deadline", _DEADLINE)):
            threading.Thread(target=_run_later, args=(todo,), name=name, daemon=True).start()


def pid() -> int | None:
    """The process id of this process's shared worker, None if none runs."""
    return _SHARED.pid


def ping() -> int:
    """The process id of the process that runs it: in the worker, the worker's."""
    return os.getpid()


def _watch_parent(parent: int) -> None:
    """End the worker if its parent dies (SIGKILL, a crash): SIGTERM unwinds a job."""
    while True:
        time.sleep(PARENT_CHECK_S)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
            return


def _answer(function: str, kwargs: dict[str, Any]) -> tuple[str, Any]:
    from opcost import gpu_setting

    try:
        with gpu_setting.sigterm_unwinds():
            return "ok", _resolve(function)(**kwargs)
    except Exception as e:
        e.add_note(f"(in the measurement worker, pid {os.getpid()})\n{traceback.format_exc()}")
        try:
            pickle.loads(pickle.dumps(e))  # must also rebuild on the other side
        except Exception:
            return "error", RemoteError(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        return "error", e


def main() -> None:
    """The worker's loop: read a request, run it, answer; until stdin closes."""
    requests = sys.stdin.buffer
    # The parent stops a measurement with SIGTERM (stop_on_interrupt): a Ctrl-C, which
    # reaches the whole process group, must not kill the worker between its own files.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    while True:
        try:
            function, kwargs = _read_frame(requests)
        except EOFError:
            return
        _write_frame(answers, _answer(function, kwargs))


if __name__ == "__main__":
    main()
