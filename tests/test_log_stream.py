"""Worker output reaches the controller's run directory over the network.

A real actor process is started the way a host that shares nothing with the
controller starts it: a private scratch directory for `--run-dir`, and nothing but
the controller's name-service endpoint and the run's CURVE keys in its environment.
Its config, its stats endpoint and its log stream all come through the name service,
and everything it writes (log lines, the stacks SIGUSR1 asks for) ends up in the
controller's `logs/actor-0.log`, once. The forwarder's own bounds follow: a full
stream drops and says so without blocking, and output never sent stays on the
worker's host.
"""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from srl_jax.dataflow.stream_table import CHANGES, LOGS, STATS
from srl_jax.runtime.log_stream import LogSink
from srl_jax.runtime.name_server import NAMES_ENV, NameServer
from srl_jax.wire.names import FileNameService
from srl_jax.wire.streams import RejectCounter, make_socket, receive, send
from srl_jax.wire.transport import KEYS_ENV, CurveKeys, Transport
from tests.conftest import Processes, make_config, wait_for, write_run_dir


class Controller:
    """What a controller serves a worker on another host: names, its config, the stats
    and logs streams, over CURVE."""

    def __init__(self, run_dir: Path, workers: list[str]) -> None:
        self.context = zmq.Context()
        self.keys = CurveKeys.generate()
        self.transport = Transport(self.context, keys=self.keys)
        self.names = NameServer(self.transport, (run_dir / "config.yaml").read_text())
        self.logs = LogSink(self.transport, self.names, run_dir / "logs", workers)
        self.stats = make_socket(self.context, STATS.bind_type)
        self.transport.bind(self.stats, self.names, STATS.key())

    def env(self) -> dict[str, str]:
        """All a worker is given to find the run."""
        return {NAMES_ENV: self.names.endpoint, KEYS_ENV: self.keys.to_env()}

    def waiting_on(self) -> str | None:
        """What the worker's heartbeats so far say it waits on."""
        waits = None
        while (received := receive(self.stats, STATS.binder_receives, RejectCounter())):
            waits = (received[1].meta["waiting"] or [waits])[0]
        return waits

    def close(self) -> None:
        self.logs.close()
        self.stats.close()
        self.names.close()
        self.transport.close()
        self.context.term()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run_dir(tmp_path / "run", make_config(["actors.count=1"]))


@pytest.fixture
def controller(run_dir: Path) -> Iterator[Controller]:
    served = Controller(run_dir, ["actor-0"])
    yield served
    served.close()


def test_a_worker_with_a_private_directory_logs_into_the_controllers_run(
        processes: Processes, tmp_path: Path, run_dir: Path, controller: Controller) -> None:
    host = tmp_path / "other-host"
    host.mkdir()
    actor = processes.start([sys.executable, "-m", "srl_jax.worker", "actor", "0", "--run-dir",
                             str(host / "scratch")], log=host / "launcher.log",
                            env=controller.env())
    waiting = wait_for(controller.waiting_on, 60, "the actor's heartbeat, waiting on its peers")
    assert "port.inference.0" in waiting or "port.samples.0" in waiting, waiting
    log = run_dir / "logs" / "actor-0.log"
    actor.send_signal(signal.SIGUSR1)  # stacks, as `srl_jax.runtime.status --stacks` asks
    wait_for(lambda: log.exists() and "Thread 0x" in log.read_text(), 30, "the actor's stacks")
    actor.send_signal(signal.SIGTERM)
    assert actor.wait(timeout=30) == 0
    controller.logs.close()

    text = log.read_text()
    assert "actor-0 INFO" in text and "stopped while waiting for" in text, text
    assert text.count(": stopped\n") == 1, "each line once"
    assert "Current thread 0x" in text or "Thread 0x" in text
    assert (host / "launcher.log").read_text() == "", "nothing left on the worker's host"
    assert sorted(p.name for p in host.iterdir()) == ["launcher.log", "scratch"]
    assert not (run_dir / "names").exists(), "no name was written to a file"
    assert controller.names.rejects.count == controller.logs.rejects.count == 0
    keys = [port.key for port in controller.transport.ports]
    assert keys == [CHANGES.key(), "port.names", LOGS.key(), STATS.key()]
    assert all(port.authenticated for port in controller.transport.ports)


FLOOD = """
import os, sys, time, zmq
from pathlib import Path
from srl_jax.runtime.log_stream import LogForwarder
forwarder = LogForwarder("actor-0")
print("early, before the stream", flush=True)
forwarder.connect(zmq.Context.instance(), sys.argv[1], None)
block = b"x" * 65535 + b"\\n"
started = time.monotonic()
for _ in range(int(sys.argv[3])):
    os.write(1, block)
took = time.monotonic() - started
marks = Path(sys.argv[2])
(marks / "flooded").write_text(f"{took} {forwarder.dropped}")
while not (marks / "drained").exists():
    time.sleep(0.05)
print("last line", flush=True)
forwarder.close()
(marks / "dropped").write_text(str(forwarder.dropped))
"""


def test_a_full_stream_drops_with_a_count_and_never_blocks(processes: Processes,
                                                             tmp_path: Path) -> None:
    """Nobody reads the stream while 64 MB go out: the worker goes on, drops what does not
    fit, and the first chunk that goes afterwards says how much was lost."""
    context = zmq.Context.instance()
    pull = make_socket(context, LOGS.bind_type, hwm=1)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    blocks = 1024
    try:
        flood = processes.start([sys.executable, "-c", FLOOD, f"tcp://127.0.0.1:{port}",
                                 str(tmp_path), str(blocks)], log=tmp_path / "launcher.log")
        marks = tmp_path / "flooded"
        took, dropped = map(float, wait_for(lambda: marks.exists() and marks.read_text(), 120,
                                            "the flood").split())
        assert took < 30 and dropped > 0, (took, dropped)
        received = []
        while pull.poll(1000):
            received.append(receive(pull, LOGS.binder_receives, RejectCounter())[1])
        (tmp_path / "drained").touch()
        assert flood.wait(timeout=30) == 0
        later = []
        while pull.poll(1000):
            later.append(receive(pull, LOGS.binder_receives, RejectCounter())[1])
    finally:
        pull.close()
    assert {m.meta["worker"] for m in received + later} == {"actor-0"}
    flooded = b"".join(m.arrays["text"].tobytes() for m in received)
    assert flooded.startswith(b"early, before the stream\n")
    assert 0 < flooded.count(b"x") < blocks * 65535, "some went, some were dropped"
    after = b"".join(m.arrays["text"].tobytes() for m in later)  # chunks as written
    assert after.endswith(b"last line\n"), after[:200]
    notes = re.findall(rb"\[srl_jax: (\d+) bytes of this worker's output were dropped here",
                       flooded + after)
    assert sum(map(int, notes)) == int((tmp_path / "dropped").read_text()) >= dropped > 0
    assert (tmp_path / "launcher.log").read_text() == ""


NEVER_CONNECTED = """
from srl_jax.runtime.log_stream import LogForwarder
forwarder = LogForwarder("actor-0")
print("said before the controller was found", flush=True)
forwarder.close()
"""


def test_output_never_sent_stays_with_the_worker(processes: Processes, tmp_path: Path) -> None:
    """A worker that dies before it finds the controller leaves its words to the file its
    launcher gave it."""
    process = processes.start([sys.executable, "-c", NEVER_CONNECTED],
                              log=tmp_path / "launcher.log")
    assert process.wait(timeout=30) == 0
    assert (tmp_path / "launcher.log").read_text() == "said before the controller was found\n"


def test_chunks_of_strangers_are_counted_and_dropped(tmp_path: Path) -> None:
    context = zmq.Context()
    transport = Transport(context)
    sink = LogSink(transport, FileNameService(tmp_path / "names"), tmp_path, ["actor-0"])
    push = make_socket(context, LOGS.connect_type)
    try:
        push.connect(sink.endpoint)
        text = np.frombuffer(b"a line\n", np.uint8)
        send(push, "log", {"worker": "../../escape"}, {"text": text})
        send(push, "log", {"worker": ["actor-0"]}, {"text": text})
        send(push, "log", {"worker": "actor-0"}, {"text": text.astype(np.int16)})
        send(push, "log", {"worker": "actor-0"}, {"text": text, "more": text})
        send(push, "stats", {"worker": "actor-0"}, {"text": text})
        send(push, "log", {"worker": "actor-0"}, {"text": text})
        wait_for(lambda: (tmp_path / "actor-0.log").exists()
                 and sink.rejects.count == 5, 10, "the sink's drops")
    finally:
        push.close()
        sink.close()
        transport.close()
        context.term()
    assert (tmp_path / "actor-0.log").read_text() == "a line\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["actor-0.log", "names"]


OUT_OF_FILES = """
import errno, os, sys, time, zmq
import numpy as np
from pathlib import Path
from srl_jax.dataflow.stream_table import LOGS
from srl_jax.runtime.log_stream import LogSink
from srl_jax.wire.names import FileNameService
from srl_jax.wire.streams import make_socket, send
from srl_jax.wire.transport import Transport

logs = Path(sys.argv[1])
context = zmq.Context()
sink = LogSink(Transport(context), FileNameService(logs / "names"), logs,
               [f"actor-{i}" for i in range(4)], open_logs=2)
push = make_socket(context, LOGS.connect_type)
push.connect(sink.endpoint)

def say(worker, text):
    send(push, "log", {"worker": worker}, {"text": np.frombuffer(text.encode(), np.uint8)})

def wait(predicate):
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline and sink._thread.is_alive(), sink.errors
        time.sleep(0.01)

def held():
    return sum(os.readlink(f"/proc/self/fd/{fd}").startswith(str(logs))
               for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))

say("actor-0", "first of 0\\n")
wait(lambda: held() == 1)
hoard = []
try:
    while True:
        hoard.append(os.open(os.devnull, os.O_RDONLY))
except OSError as error:
    assert error.errno == errno.EMFILE
say("actor-1", "lost: no descriptor left\\n")
wait(lambda: sink.errors == 1)
for fd in hoard:
    os.close(fd)
for i in range(3):
    say(f"actor-{i}", f"second of {i}\\n")
wait(lambda: (logs / "actor-2.log").exists() and held() == 2)
(logs / "actor-3.log").mkdir()
say("actor-3", "lost: its log is a directory\\n")
wait(lambda: sink.errors == 2)
say("actor-1", "third of 1\\n")
wait(lambda: "third" in (logs / "actor-1.log").read_text())
sink.close()
assert not sink._thread.is_alive() and sink.errors == 2 and sink.rejects.count == 0
print(held(), flush=True)
"""


def test_the_sink_holds_few_files_and_outlives_running_out_of_descriptors(
        processes: Processes, tmp_path: Path) -> None:
    """Every descriptor of the process taken (for real: opened until EMFILE), then a log
    that cannot be opened at all: each error loses its chunk and is counted, and the sink
    writes on once descriptors are back, three workers' logs through two open files."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    sink = processes.start([sys.executable, "-c", OUT_OF_FILES, str(logs)], log=out,
                           stderr_to=tmp_path / "err")
    assert sink.wait(timeout=60) == 0, (tmp_path / "err").read_text()
    assert out.read_text() == "0\n", "every file closed with the sink"
    assert "Too many open files" in (tmp_path / "err").read_text(), "said once"
    texts = [(logs / f"actor-{i}.log").read_text() for i in range(3)]
    assert texts == ["first of 0\nsecond of 0\n", "second of 1\nthird of 1\n",
                     "second of 2\n"]
