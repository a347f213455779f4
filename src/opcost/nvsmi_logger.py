"""``nvidia-smi`` logging power to a CSV file in the background: :class:`PowerLogger`.

The profiling job wraps each measurement in a :class:`PowerLogger` (a context manager);
the CSV it leaves is ``nvidia-smi``'s own output, read later by :mod:`opcost.powerlog`.
One-shot queries of ``nvidia-smi`` and the checks of GPU ids and field names are in
:mod:`opcost.nvsmi`.
"""

from __future__ import annotations

import csv
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from opcost.nvsmi import (
    MISSING_MESSAGE,
    NvidiaSmiError,
    check_fields,
    check_gpu,
    nvidia_smi_path,
)


class PowerLogger:
    """``nvidia-smi`` logging power to a CSV file in the background, as a context manager.

    On entry it starts::

        nvidia-smi --query-gpu=<fields> --format=csv,nounits -lms <interval_ms> -i <gpu> -f <path>

    and watches it for ``start_grace_s``: a logger that cannot start (no such GPU, an
    invalid field, a lost driver) exits within that time, and the error says why. It cannot
    wait for the first line instead: with ``-f`` nvidia-smi buffers its output in 4 KiB
    blocks (H100, driver 580, 2026-11-22: the file stayed empty for 2.5 s of 20 ms polling
    and received all 129 lines when nvidia-smi was stopped). On exit it stops the logger
    (SIGTERM, then SIGKILL after ``stop_timeout_s``), which writes out the buffer, and checks
    that the file holds the header and at least one sample. The CSV is ``nvidia-smi``'s own
    output, never edited here (see docs/formats.md).

    A process killed outright (SIGKILL, or SIGTERM with no handler that unwinds) cannot stop
    its logger, which then appends to the file until it is killed. Under SLURM the job's
    processes are killed together; locally, :func:`opcost.gpu_setting.sigterm_unwinds`
    turns SIGTERM into ``SystemExit`` so that this context manager's exit runs.
    (``PR_SET_PDEATHSIG`` would need ``preexec_fn``, which can deadlock a threaded process.)

    Raises (on entry):
        NvidiaSmiError: ``nvidia-smi`` is missing, or exited within the grace time (its
            exit code and stderr are in the message).
    Raises (on exit):
        NvidiaSmiError: ``nvidia-smi`` had died before it was stopped, so the log ended
            before the measurement did, or it wrote no header and sample at all.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        gpu: str,
        fields: Sequence[str],
        interval_ms: int = 20,
        *,
        start_grace_s: float = 0.25,
        stop_timeout_s: float = 2.0,
    ) -> None:
        self.path = Path(path)
        self.gpu = check_gpu(gpu)
        self.fields = tuple(check_fields(fields))
        if not isinstance(interval_ms, int) or isinstance(interval_ms, bool) or interval_ms < 1:
            raise NvidiaSmiError(f"interval_ms must be a positive integer, not {interval_ms!r}")
        self.interval_ms = interval_ms
        self.start_grace_s = start_grace_s
        self.stop_timeout_s = stop_timeout_s
        self.returncode: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    def command(self, smi: str) -> list[str]:
        """The argument list that starts the logger with the binary ``smi``."""
        return [
            smi,
            f"--query-gpu={','.join(self.fields)}",
            "--format=csv,nounits",
            "-lms",
            str(self.interval_ms),
            "-i",
            self.gpu,
            "-f",
            str(self.path),
        ]

    def start(self) -> None:
        """Start logging; raise if nvidia-smi exits within the grace time."""
        if self._proc is not None:
            raise NvidiaSmiError(f"the power logger for {self.path} is already running")
        smi = nvidia_smi_path()
        # A file left from an earlier attempt would look like a started logger.
        self.path.unlink(missing_ok=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Open for the logger's lifetime (closed in stop()); a file, not a pipe, so that a
        # chatty nvidia-smi can never block on a full pipe.
        self._stderr = tempfile.TemporaryFile(prefix="nvidia-smi-")  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                self.command(smi),
                stdin=subprocess.DEVNULL,
                stdout=self._stderr,
                stderr=self._stderr,
            )
        except FileNotFoundError as e:
            self._close_stderr()
            raise NvidiaSmiError(MISSING_MESSAGE) from e
        try:
            self._watch_start()
        except BaseException:
            self._terminate()
            self._close_stderr()
            self._proc = None
            raise

    def _watch_start(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_grace_s
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise NvidiaSmiError(
                    f"nvidia-smi exited with code {code} before logging power to {self.path}: "
                    f"{self._stderr_text() or '(no message)'}; command: "
                    f"{' '.join(self._proc.args)}"  # type: ignore[arg-type]
                )
            time.sleep(0.01)

    def _check_written(self) -> None:
        """The stopped logger's file must hold its header and at least one sample."""
        lines = self._read_start().split("\n")
        if len(lines) < 3:
            found = f"holds only {lines[0][:200]!r}" if lines[0] else "is empty"
            raise NvidiaSmiError(
                f"nvidia-smi wrote no power sample to {self.path} (the file {found}); "
                f"the driver may be hung: run `nvidia-smi` by hand"
            )
        n_columns = len(next(csv.reader([lines[0]], skipinitialspace=True)))
        if n_columns != len(self.fields):
            raise NvidiaSmiError(
                f"{self.path}: nvidia-smi wrote the header {lines[0]!r} with "
                f"{n_columns} columns for {len(self.fields)} fields {self.fields}"
            )

    def _read_start(self) -> str:
        try:
            with open(self.path, "rb") as f:
                return f.read(64 * 1024).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def _stderr_text(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read(4000).decode("utf-8", errors="replace").strip()

    def _close_stderr(self) -> None:
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _terminate(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.returncode = proc.returncode

    def stop(self) -> None:
        """Stop logging; raise if ``nvidia-smi`` had already died on its own.

        Raises:
            NvidiaSmiError: the logger exited before this call, so the log is shorter
                than the measurement it was meant to cover.
        """
        proc = self._proc
        if proc is None:
            return
        died = proc.poll()
        try:
            self._terminate()
            message = self._stderr_text()
        finally:
            self._close_stderr()
            self._proc = None
        if died is not None:
            raise NvidiaSmiError(
                f"nvidia-smi stopped logging to {self.path} on its own (exit code {died}) "
                f"before the measurement ended: {message or '(no message)'}; the log is "
                f"incomplete, rerun the job"
            )
        self._check_written()

    def __enter__(self) -> PowerLogger:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.stop()
            return
        # The body's own error comes first; an early death of the logger is added to it.
        try:
            self.stop()
        except NvidiaSmiError as stop_error:
            exc.add_note(str(stop_error))
