"""Worker output to the controller's run directory, for hosts that share no filesystem.

With the network name service (srl_jax/runtime/name_server.py) a worker's file descriptors 1
and 2 are a pipe that a thread of the worker reads: everything the process writes
there (its log lines, a traceback, the stacks SIGUSR1 makes it write, what its
libraries print) goes as it was written, in chunks, on the logs stream (PUSH with a
high-water mark of LOG_QUEUE messages). The controller's `LogSink` appends each chunk
to `logs/<worker>.log` in its run directory: that file is complete on the
controller's host, and nothing else writes it while the stream works. The sink holds
at most OPEN_LOGS of those files open, the least recently written closed first (and
opened again, to append, when that worker writes next): a run of 10,000 workers needs no
10,000 descriptors in the controller, and each file stays whole where per-host files
would interleave a host's workers. Its thread outlives every error (no descriptor left,
a full disk, a message it cannot take): the chunk is lost, counted in `errors`
(`system/log_errors` in the metrics rows), and the next is taken as usual.

Sending never blocks the worker: with the queue full a chunk is dropped, and the next
chunk that goes starts with a line saying how many bytes were lost. Output from before
the stream is connected is held (up to EARLY_BYTES, oldest dropped first); what was
never sent when the worker exits goes to the output it was started with (its
launcher's file, on its own host).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import zmq

from srl_jax.dataflow.stream_table import LOGS
from srl_jax.wire.names import NameService
from srl_jax.wire.streams import NOBLOCK, RejectCounter, make_socket, receive, send
from srl_jax.wire.transport import CurveKeys, Transport, curve_connect

log = logging.getLogger(__name__)

LOG_QUEUE = 256
"""Chunks queued towards the controller (ZMQ high-water mark, each end)."""
CHUNK_BYTES = 1 << 16
"""Largest chunk read from the pipe and sent as one message."""
PIPE_BYTES = 1 << 20
"""Kernel buffer asked for the pipe, so that a burst (stacks written from a signal
handler) fits while the reading thread waits for the interpreter."""
EARLY_BYTES = 1 << 20
"""Output held before the stream is connected."""
LINGER_MS = 2000
"""How long the last chunks may take to leave when the worker exits."""
POLL_MS = 50
QUIET_S = 0.3
"""The sink stops once nothing has come for this long, after its workers are gone."""
OPEN_LOGS = 1024
"""Log files the sink holds open at once (the least recently written is closed first): a
run of up to this many workers opens each once; 10,000 workers that log a line each 30 s
(bench/swarm.py) reopen some 300 a second, each a system call or two, without Python's
buffered file objects."""
ERROR_PAUSE_S = 0.05
"""The sink's pause after an error, so that one that repeats costs no core."""


class LogForwarder:
    """This process's stdout and stderr, sent to the controller on the logs stream."""

    def __init__(self, worker: str) -> None:
        """Route fds 1 and 2 through the pipe from now on; `worker` names the log file."""
        self.worker = worker
        self.dropped = 0
        """Bytes of output lost because the stream was full (or never connected in time)."""
        self._lost = 0
        """Bytes lost since the last chunk that went; the next one says so."""
        self._early: deque[bytes] = deque()
        self._early_bytes = 0
        self._target: tuple[zmq.Context, str, CurveKeys | None] | None = None
        self._lock = threading.Lock()
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = os.dup(1), os.dup(2)
        self._read_fd, write_fd = os.pipe()
        with contextlib.suppress(OSError, AttributeError):  # Linux; elsewhere the default
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._thread = threading.Thread(target=self._pump, name="log-forwarder", daemon=True)
        self._thread.start()

    def connect(self, context: zmq.Context, endpoint: str, keys: CurveKeys | None) -> None:
        """Send from now on to the controller's logs stream at `endpoint`."""
        with self._lock:
            self._target = (context, endpoint, keys)

    def close(self, timeout_s: float = LINGER_MS / 1000 + 1) -> None:
        """Put fds 1 and 2 back, and wait (bounded) for the pipe's last output to leave."""
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self._saved, strict=True):
            os.dup2(saved, fd)
        self._thread.join(timeout_s)

    def _pump(self) -> None:
        socket = None
        while chunk := os.read(self._read_fd, CHUNK_BYTES):
            socket = socket or self._open()
            if socket is None:
                self._hold(chunk)
            else:
                self._send(socket, chunk)
        socket = socket or self._open()
        if socket is not None:
            socket.close(linger=LINGER_MS)
        os.close(self._read_fd)
        while self._early:  # never connected: the launcher's file has it
            os.write(self._saved[1], self._early.popleft())

    def _open(self) -> zmq.Socket | None:
        """The stream's socket once `connect` was called, with the held output sent first."""
        with self._lock:
            target = self._target
        if target is None:
            return None
        context, endpoint, keys = target
        socket = make_socket(context, LOGS.connect_type, hwm=LOG_QUEUE)
        curve_connect(socket, endpoint, keys)
        while self._early:
            self._send(socket, self._early.popleft())
        self._early_bytes = 0
        return socket

    def _hold(self, chunk: bytes) -> None:
        self._early.append(chunk)
        self._early_bytes += len(chunk)
        while self._early_bytes > EARLY_BYTES:
            oldest = self._early.popleft()
            self._early_bytes -= len(oldest)
            self._lose(len(oldest))

    def _lose(self, count: int) -> None:
        self.dropped += count
        self._lost += count

    def _send(self, socket: zmq.Socket, chunk: bytes) -> None:
        text = chunk
        if self._lost:
            text = (f"[srl_jax: {self._lost} bytes of this worker's output were dropped "
                    "here: its log stream to the controller was full]\n").encode() + chunk
        try:
            send(socket, "log", {"worker": self.worker, "pid": os.getpid()},
                 {"text": np.frombuffer(text, np.uint8)}, flags=NOBLOCK)
            self._lost = 0
        except zmq.Again:
            self._lose(len(chunk))


class LogSink:
    """The controller's end: each known worker's chunks appended to `logs/<worker>.log`,
    from a thread of its own that no error stops (the module's docstring says why)."""

    def __init__(self, transport: Transport, names: NameService, logs_dir: Path,
                 workers: Iterable[str], open_logs: int = OPEN_LOGS) -> None:
        """`workers`: the names whose output is taken (anything else is counted and dropped);
        `open_logs`: the most files held open at once."""
        self.rejects = RejectCounter()
        self.errors = 0
        """Errors the thread survived (`system/log_errors`): each lost what it was writing."""
        self._dir = Path(logs_dir)
        self._workers = frozenset(workers)
        self._open_logs = open_logs
        self._files: OrderedDict[str, int] = OrderedDict()
        """Open files' descriptors, the least recently written first."""
        self._stopping = threading.Event()
        self._socket = make_socket(transport.context, LOGS.bind_type, hwm=LOG_QUEUE)
        self.endpoint = transport.bind(self._socket, names, LOGS.key())
        self._thread = threading.Thread(target=self._serve, name="log-sink", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 3.0) -> None:
        """Take what is still on its way (until quiet for QUIET_S, at most `timeout_s`)."""
        self._stopping.set()
        self._thread.join(timeout_s)

    def _serve(self) -> None:
        quiet_since = None
        try:
            while True:
                try:
                    ready = self._socket.poll(POLL_MS)
                    if ready:
                        self._drain()
                except Exception as error:  # counted; the thread goes on
                    self._survive(error)
                    ready = False
                if ready:
                    quiet_since = None
                elif self._stopping.is_set():
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since >= QUIET_S:
                        return
        finally:
            self._socket.close(linger=0)
            while self._files:
                self._close_oldest()

    def _survive(self, error: Exception) -> None:
        """Count an error, say so (the first, then every hundredth), and let go of the open
        files where descriptors ran out."""
        self.errors += 1
        if self.errors == 1 or self.errors % 100 == 0:
            log.warning("log sink: %s (%d errors so far; what was being written is lost)",
                        error, self.errors)
        if isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE):
            while self._files:
                self._close_oldest()
        time.sleep(ERROR_PAUSE_S)

    def _drain(self) -> None:
        while (received := receive(self._socket, LOGS.binder_receives,
                                   self.rejects)) is not None:
            message = received[1]
            worker, text = message.meta.get("worker"), message.arrays.get("text")
            if not isinstance(worker, str) or worker not in self._workers or text is None \
                    or len(message.arrays) != 1 or text.dtype != np.uint8 or text.ndim != 1:
                self.rejects.reject(ValueError("log chunk: not one uint8 text of a worker "
                                               "of this run"))
                continue
            data = memoryview(text.data).cast("B")
            while data:  # a regular file takes it whole but where the disk is full
                data = data[os.write(self._file(worker), data):]

    def _file(self, worker: str) -> int:
        """`worker`'s log's descriptor, open to append, now the most recently written."""
        fd = self._files.get(worker)
        if fd is not None:
            self._files.move_to_end(worker)
            return fd
        while len(self._files) >= self._open_logs:
            self._close_oldest()
        fd = self._files[worker] = os.open(os.path.join(self._dir, f"{worker}.log"),
                                           os.O_WRONLY | os.O_APPEND | os.O_CREAT
                                           | os.O_CLOEXEC, 0o644)
        return fd

    def _close_oldest(self) -> None:
        _, fd = self._files.popitem(last=False)
        os.close(fd)
