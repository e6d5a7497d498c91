"""The controller's side of a population run, over real sockets: it records the copies the
learners report in its own run directory's `population.jsonl`, hands a starting manager
the lineage so far (a resumed run's included), refuses what is no copy of a member, and
sends every metrics row to the manager. The run that uses it is tests/test_population_run.py."""

from __future__ import annotations

import json
from pathlib import Path

import zmq

from srl_jax.config.population import append_lineage, parse_lineage, read_lineage
from srl_jax.dataflow.stream_table import LINEAGE, ROWS
from srl_jax.runtime.population_link import PopulationLink
from srl_jax.wire.names import FileNameService
from srl_jax.wire.streams import RejectCounter, ask, make_socket, receive
from srl_jax.wire.transport import Transport


def copy_of(member: str, donor: str, version: int) -> dict:
    return {"time": 1.0, "member": member, "donor": donor, "donor_step": 40,
            "version": version, "old_hyperparams": {"lr": 1e-7}, "hyperparams": {"lr": 1e-3},
            "scores": {"m0": 30.0, "m1": 9.0}}


def test_the_controller_keeps_the_lineage_and_sends_the_rows(tmp_path: Path) -> None:
    earlier = copy_of("m1", "m0", 20)
    append_lineage(tmp_path, earlier)  # a resumed run's copy
    with (tmp_path / "population.jsonl").open("a") as lineage:
        lineage.write('{"time": 2.0, "member": "m0", "don')  # torn by a kill: left out
    context = zmq.Context()
    transport = Transport(context)
    names = FileNameService(tmp_path / "names")
    link = PopulationLink(transport, names, tmp_path, ["m0", "m1"])
    dealer = make_socket(context, LINEAGE.connect_type)
    rows = make_socket(context, ROWS.connect_type)
    rows.setsockopt(zmq.SUBSCRIBE, b"")
    rejects = RejectCounter()
    try:
        dealer.connect(names.lookup(LINEAGE.key(), 5))
        rows.connect(names.lookup(ROWS.key(), 5))
        later = copy_of("m0", "m1", 70)
        kept = ask(dealer, "lineage_event", {"event": later}, LINEAGE.connecter_receives,
                   rejects, 10)
        assert kept is not None and kept.meta["count"] == 2 and "error" not in kept.meta
        for stranger in (copy_of("m7", "m0", 5), {**later, "version": "70"}, ["m0"],
                         copy_of("m0", "m0", 71),
                         {**later, "hyperparams": {"lr": float("nan")}}):
            refused = ask(dealer, "lineage_event", {"event": stranger},
                          LINEAGE.connecter_receives, rejects, 10)
            assert refused is not None and refused.meta["count"] == 2, stranger
            assert refused.meta["error"]
        dealer.send_multipart([b"\xc1 not a message"])
        so_far = ask(dealer, "lineage_request", {}, LINEAGE.connecter_receives, rejects, 10)
        assert so_far is not None
        assert parse_lineage(so_far.arrays["events"].tobytes().decode()) == [earlier, later]
        assert read_lineage(tmp_path) == [earlier, later], "in the controller's run directory"

        row = {"time": 3.0, "policy/m0/episode_return_mean": 21.5,
               "policy/m0/policy_version": 12}
        for _ in range(100):  # a PUB drops what it sends before the subscription arrives
            link.publish(json.dumps(row))
            if rows.poll(50):
                break
        received = receive(rows, ROWS.connecter_receives, rejects)
        assert received is not None
        assert json.loads(received[1].arrays["row"].tobytes()) == row
    finally:
        dealer.close()
        rows.close()
        link.close()
        transport.close()
        context.term()
    assert link.rejects.count == 6, "five strangers and one undecodable message"
    assert rejects.count == 0
    assert [port.key for port in transport.ports] == [ROWS.key(), LINEAGE.key()]
