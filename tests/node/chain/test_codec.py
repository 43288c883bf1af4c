"""The raw reads (`node.chain.codec` over `RawRPC`) give what web3's contract calls give, and refuse
answers that are not the ledger's."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from web3 import Web3

from node.chain.client import CountingHTTPProvider, LedgerClient, raw_reader
from node.chain.codec import EventCodec, ViewCodec
from node.chain.errors import LedgerError


def _abi() -> list[dict]:
    return json.loads(resources.files("node.chain").joinpath("artifacts/SwarmLedger.json").read_text())["abi"]


def test_raw_views_and_logs_equal_web3s(automine_chain, kit):
    swarm = kit.Swarm(automine_chain, 3)
    swarm.register(3)
    swarm.commit_all(1, 3)
    raw = swarm.reader
    via_web3 = LedgerClient(swarm.w3, swarm.address)
    via_web3._raw = False  # no raw reader: web3's contract calls and event decoding
    peer = swarm.accounts[1].address
    for read in (
        lambda c: c.params(),
        lambda c: c.round_info(1),
        lambda c: c.last_finalized(),
        lambda c: c.current_round(),
        lambda c: c.commitments(1),
        lambda c: c.registrations(),
        lambda c: c.commit_history(peer),
        lambda c: c.peer_id_of(peer),
        lambda c: c.eps_spent(peer),
        lambda c: c.is_registered(peer),
    ):
        assert read(raw) == read(via_web3)
    assert raw._raw_rpc() is not None and via_web3._raw_rpc() is None


def test_an_answer_that_is_not_the_views_output_is_refused():
    views = ViewCodec(_abi())
    assert views.decode("currentRound", "0x" + (7).to_bytes(32, "big").hex()) == 7
    for answer in ("0x", "0x12", None, "nothex"):
        with pytest.raises(LedgerError, match="currentRound"):
            views.decode("currentRound", answer)


def test_a_log_that_is_not_the_events_is_refused():
    events = EventCodec(_abi())
    query = events.query("Committed", "0x" + "11" * 20, 5, 9, {"round": 3})
    topic0, round_topic = query["topics"]
    assert round_topic == "0x" + (3).to_bytes(32, "big").hex() and query["fromBlock"] == "0x5"
    attested = events.query("Attested", "0x" + "11" * 20, 5, 9, None)["topics"][0]
    log = {"topics": [attested, round_topic, "0x" + "00" * 32], "data": "0x", "blockNumber": "0x5", "logIndex": "0x0"}
    for answer in ([log], [{"topics": [topic0]}], {"not": "a list"}):
        with pytest.raises(LedgerError, match="Committed"):
            events.decode("Committed", answer)


def test_no_raw_reader_for_an_endpoint_behind_a_proxy():
    """The raw reader does not speak a proxy: an endpoint reached through one is read by web3."""
    direct = Web3(CountingHTTPProvider("http://127.0.0.1:8545"))
    proxied = Web3(CountingHTTPProvider("http://127.0.0.1:8545", request_kwargs={"proxies": {"http": "http://p:3128"}}))
    assert raw_reader(direct) is not None and raw_reader(proxied) is None


def test_a_length_past_2_to_the_63_is_refused_not_raised():
    """eth_abi raises OverflowError (not a DecodingError) for a `bytes` length or offset too large for
    an index: a view's answer or a log carrying one is the endpoint's fault like any other (LedgerError)."""
    word = (2**64).to_bytes(32, "big")
    with pytest.raises(LedgerError, match="peerIdOf"):
        ViewCodec(_abi()).decode("peerIdOf", "0x" + ((32).to_bytes(32, "big") + word).hex())
    with pytest.raises(LedgerError, match="peerIdOf"):  # the offset itself
        ViewCodec(_abi()).decode("peerIdOf", "0x" + (word + word).hex())
    events = EventCodec(_abi())
    topic0, round_topic = events.query("Complained", "0x" + "11" * 20, 5, 9, {"round": 3})["topics"]
    log = {
        "topics": [topic0, round_topic, "0x" + "00" * 32],
        "data": "0x" + ((32).to_bytes(32, "big") + word).hex(),
        "blockNumber": "0x5",
        "logIndex": "0x0",
    }
    with pytest.raises(LedgerError, match="Complained"):
        events.decode("Complained", [log])
    log["data"] = "0x" + ((32).to_bytes(32, "big") + (3).to_bytes(32, "big") + b"abc".ljust(32, b"\0")).hex()
    assert events.decode("Complained", [log])[0]["args"]["frame"] == b"abc"
