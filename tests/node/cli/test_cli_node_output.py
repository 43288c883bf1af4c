"""What `swarm node` prints and how its failures become one line: the reporter following a
workdir's files, the addresses it advertises for a wildcard listen address, the shared-data
warning, and the unwrapping of trio's ExceptionGroups. No chain or network needed: the files are
the ones the peer writes (node.runfiles), the sockets real loopback sockets."""

from __future__ import annotations

import socket
import time

import pytest

from node.chain.errors import LedgerError
from node.chain.sender import InsufficientFunds
from node.cli import common
from node.cli.node_output import NodeReporter, format_round, same_data_suspects, tcp_endpoint, tcp_problem
from node.runfiles import MetricsWriter, write_json_atomic

PEER_ID = "12D3KooWGgpcVCY9V3D5pJn4ifJLtEysQUZAaqxHGFWA97gZJJDw"
ME = "0x" + "aa" * 20
OTHER = "0x" + "bb" * 20


def _round_record(r: int, state: str = "finalized") -> dict:
    return {
        "round": r,
        "state": state,
        "committed": True,
        "included": 3,
        "accuracy": 0.5 + r / 10,
        "eps_cumulative": 1.5 * r,
        "delta_cumulative": 0.0,
        "eps_protects": "whole shared update: sign",
        "peer": ME,
    }


def test_reporter_prints_addresses_rounds_and_summary(tmp_path):
    (tmp_path / "peer.json").write_text('{"stale": true}')  # a previous run's file is not this run's
    with MetricsWriter(tmp_path / "metrics.jsonl") as old:
        old.write(_round_record(1, "aborted"))  # a previous run's line is not reported either
    lines: list[str] = []
    warnings: list[str] = []
    samples = {1: [(ME, 500), (OTHER, 500)], 2: [(ME, 500), (OTHER, 500)]}
    reporter = NodeReporter(
        tmp_path,
        rounds=2,
        say=lines.append,
        warn=warnings.append,
        commitments=samples.__getitem__,
        partitioned=False,
        poll=0.05,
    )
    assert not (tmp_path / "peer.json").exists()
    reporter.start()
    addrs = [f"/ip4/192.0.2.7/tcp/4001/p2p/{PEER_ID}", f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER_ID}"]
    write_json_atomic(tmp_path / "peer.json", {"peer_id": PEER_ID, "addrs": addrs, "address": ME})
    with MetricsWriter(tmp_path / "metrics.jsonl") as metrics:
        metrics.write(_round_record(1))
        metrics.write(_round_record(2))
    deadline = time.monotonic() + 10
    while len(reporter.records) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    reporter.stop()
    assert lines[:2] == [f"peer id {PEER_ID}", f"eth address {ME}"]
    assert f"listening on {addrs[0]}" in lines and f"listening on {addrs[1]}" in lines
    assert f"other peers join with: --bootstrap {addrs[0]}" in lines  # not the loopback one
    rounds = [line for line in lines if line.startswith("round ")]
    assert rounds == [format_round(_round_record(1), 2), format_round(_round_record(2), 2)]
    assert rounds[0] == (
        "round 1/2: finalized, committed, 3 peers included, accuracy 0.6000, "
        "eps 1.5 (delta 0, whole shared update: sign)"
    )
    assert reporter.summary() == (
        "finished: 2 of 2 rounds played here (2 finalized, 0 aborted), committed in 2; final accuracy 0.7000; "
        "eps 3 (delta 0, whole shared update: sign) spent in total"
    )
    assert len(warnings) == 1 and OTHER in warnings[0] and "--partition i/N" in warnings[0]  # once per peer


def test_shared_data_is_suspected_only_without_a_partition():
    commits = [(ME, 500), (OTHER, 500), ("0x" + "cc" * 20, 499)]
    assert same_data_suspects(commits, ME.upper().replace("0X", "0x"), partitioned=False) == [(OTHER, 500)]
    assert same_data_suspects(commits, ME, partitioned=True) == []  # equal IID shards are normal
    assert same_data_suspects(commits[1:], ME, partitioned=False) == []  # no commit of ours this round


def test_unreachable_bootstrap_is_warned_after_the_grace(tmp_path):
    with socket.socket() as s:  # a port that was free a moment ago and has no listener now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    closed = f"/ip4/127.0.0.1/tcp/{port}/p2p/{PEER_ID}"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        open_addr = f"/ip4/127.0.0.1/tcp/{listener.getsockname()[1]}/p2p/{PEER_ID}"
        assert tcp_problem(open_addr) is None
        assert tcp_problem(closed) == "Connection refused"
        warnings: list[str] = []
        reporter = NodeReporter(
            tmp_path,
            rounds=1,
            say=lambda line: None,
            warn=warnings.append,
            bootstrap=[closed, open_addr],
            bootstrap_grace=0.3,
            bootstrap_timeout=60,
        )
        reporter.start()
        deadline = time.monotonic() + 10
        while not warnings and time.monotonic() < deadline:
            time.sleep(0.05)
        reporter.stop()
    assert len(warnings) == 1 and closed in warnings[0] and "Connection refused" in warnings[0], warnings
    assert warnings[0].endswith("with no peer at all it stops after 60 s (--bootstrap-timeout))"), warnings
    assert tcp_endpoint("/dns4/example.org/tcp/4001/p2p/x") == ("example.org", 4001)
    assert tcp_endpoint("/ip4/1.2.3.4/udp/4001/quic") is None


def test_expected_errors_are_unwrapped_from_exception_groups():
    funds = InsufficientFunds("insufficient funds: account 0xabc holds 0 ETH")
    try:
        try:
            raise funds
        except LedgerError as exc:
            raise RuntimeError("registration failed: insufficient funds") from exc
    except RuntimeError as wrapped:
        registration = wrapped
    nested = ExceptionGroup("nursery", [ExceptionGroup("host", [registration])])
    assert common.expected_failure(nested, (RuntimeError, LedgerError)) is funds  # it names what to fund
    mismatch = RuntimeError("settings do not match the ledger's genesis digest 00ff")
    group = ExceptionGroup("nursery", [ExceptionGroup("inner", [mismatch])])
    assert common.expected_failure(group, (RuntimeError,)) is mismatch
    hint = common.one_line(mismatch, [("genesis digest", "use the ledger's --config")])
    assert hint == "settings do not match the ledger's genesis digest 00ff: use the ledger's --config"
    bug = ExceptionGroup("nursery", [mismatch, KeyError("x")])
    assert common.expected_failure(bug, (RuntimeError,)) is None  # a bug keeps its traceback
    # py-libp2p's shutdown race raised while the failing node stopped: the funds error is only the
    # context of a group around the race (an unfunded node once printed the race instead)
    raced = ExceptionGroup("libp2p", [RuntimeError("Nursery is closed to new arrivals")])
    raced.__context__ = ExceptionGroup("host", [registration])
    race = ExceptionGroup("nursery", [raced])
    assert common.expected_failure(race, (RuntimeError, LedgerError)) is funds
    assert common.interrupted(BaseExceptionGroup("n", [KeyboardInterrupt()]))
    assert not common.interrupted(group)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            'no answer after 6 attempts (Caused by NewConnectionError("x: [Errno 111] Connection refused"))',
            "Connection refused",
        ),
        ("no contract at 0x01 on chain 31337", "no contract at 0x01 on chain 31337"),
    ],
)
def test_short_reason(text, reason):
    assert common.short_reason(Exception(text)) == reason


def test_libp2p_records_are_one_line_and_stream_failures_are_dropped():
    import io
    import logging

    from node.cli.node_output import Libp2pOneLine

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(Libp2pOneLine())
    logger = logging.getLogger("libp2p.host.basic_host.test")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.error("Failed to open stream to peer %s:\n  Error: reset\n  Registry Stats: {}", "QmX")
        logger.error("Failed to open TCP stream: %s", "all attempts to connect to 127.0.0.1:1 failed")
        try:
            raise RuntimeError("inner")
        except RuntimeError:
            logger.exception("GRAFT flood detected from %s\n  applying penalty", "QmY")
        logging.getLogger("swarm.node.test").addHandler(handler)
        logging.getLogger("swarm.node.test").warning("ours\nstays whole")
    finally:
        logger.removeHandler(handler)
        logging.getLogger("swarm.node.test").removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert lines == ["GRAFT flood detected from QmY", "ours", "stays whole"], lines
