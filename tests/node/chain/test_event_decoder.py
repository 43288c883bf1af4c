"""`EventDecoder` gives what web3's `process_log` gives, value for value and type for type, on every
event of both ledgers; where it answers a log that web3 refuses or answers otherwise is a bug (the
pipelined client falls back to web3 only when the decoder raises)."""

from __future__ import annotations

import json
import random
from importlib import resources
from types import SimpleNamespace
from typing import Any

import pytest
from eth_abi import encode as abi_encode
from eth_abi.exceptions import DecodingError
from eth_utils import keccak
from hexbytes import HexBytes
from web3 import Web3
from web3._utils.method_formatters import log_entry_formatter
from web3.datastructures import AttributeDict

from node.chain.codec import EventDecoder, abi_type
from node.chain.errors import LedgerError
from node.chain.pipelined import PipelinedClient

ADDRESS = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
# what PipelinedClient._decode catches from the decoder before asking web3 (anything else escapes)
FALLS_BACK = (ValueError, TypeError, KeyError, DecodingError, OverflowError)
ARTIFACTS = ("SwarmLedger.json", "PipelinedLedger.json")


def _abi(name: str) -> list[dict[str, Any]]:
    return json.loads(resources.files("node.chain").joinpath(f"artifacts/{name}").read_text())["abi"]


def _value(kind: str, rng: random.Random) -> Any:
    if kind == "address":
        return Web3.to_checksum_address(rng.randbytes(20))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "bytes":
        return rng.randbytes(rng.choice([0, 1, 31, 32, 33, 100]))
    if kind.startswith("bytes"):
        return rng.randbytes(int(kind[5:]))
    bits = int(kind.removeprefix("u").removeprefix("int"))
    return rng.choice([0, 1, 2**bits - 1, rng.getrandbits(bits)])


def _raw_log(event: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A log of `event` as an endpoint sends it (JSON: hex strings)."""
    inputs = event["inputs"]
    signature = keccak(text=f"{event['name']}({','.join(abi_type(i) for i in inputs)})")
    values = {i["name"]: _value(i["type"], rng) for i in inputs}
    topics = [signature] + [abi_encode([i["type"]], [values[i["name"]]]) for i in inputs if i["indexed"]]
    unindexed = [i for i in inputs if not i["indexed"]]
    data = abi_encode([i["type"] for i in unindexed], [values[i["name"]] for i in unindexed])
    return {
        "address": ADDRESS.lower(),
        "topics": ["0x" + t.hex() for t in topics],
        "data": "0x" + data.hex(),
        "blockNumber": hex(rng.randrange(1, 2**32)),
        "logIndex": hex(rng.randrange(0, 300)),
        "transactionIndex": hex(rng.randrange(0, 300)),
        "transactionHash": "0x" + rng.randbytes(32).hex(),
        "blockHash": "0x" + rng.randbytes(32).hex(),
        "removed": False,
    }


def _both(artifact: str) -> tuple[list[dict[str, Any]], Any, EventDecoder]:
    """The ABI of `artifact`, web3's contract for it and the decoder."""
    abi = _abi(artifact)
    return abi, Web3().eth.contract(address=ADDRESS, abi=abi), EventDecoder(abi)


def _web3(contract: Any, name: str, log: Any) -> Any:
    return getattr(contract.events, name)().process_log(log)


def _same(a: Any, b: Any) -> None:
    """Equal, and of the same types all the way down (HexBytes is not bytes; an AttributeDict is not a dict)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict | AttributeDict):
        assert list(a.keys()) == list(b.keys())
        for key in a:
            _same(a[key], b[key])
    else:
        assert a == b


@pytest.mark.parametrize("artifact", ARTIFACTS)
def test_every_event_decodes_as_web3_decodes_it(artifact):
    abi, contract, decoder = _both(artifact)
    rng = random.Random(7)
    events = [e for e in abi if e["type"] == "event"]
    assert len(events) >= 6
    for event in events:
        for _ in range(20):
            formatted = log_entry_formatter(_raw_log(event, rng))  # as the mirror holds a pushed log
            _same(decoder.decode(formatted), _web3(contract, event["name"], formatted))
            as_read = AttributeDict.recursive(formatted)  # as web3's get_logs gives one
            _same(decoder.decode(as_read), _web3(contract, event["name"], as_read))


def _mutations(log: dict[str, Any], rng: random.Random) -> list[dict[str, Any]]:
    """`log` broken in the ways a hostile endpoint could send it."""
    topics, data = list(log["topics"]), bytes(log["data"])
    out = [
        {**log, "topics": topics[:-1]},
        {**log, "topics": [*topics, HexBytes(rng.randbytes(32))]},
        {**log, "topics": [HexBytes(rng.randbytes(32)), *topics[1:]]},
        {**log, "topics": []},
        {**log, "data": HexBytes(data[:-1])},
        {**log, "data": HexBytes(data[:-32])},
        {**log, "data": HexBytes(data + b"\x00" * 32)},
    ]
    for i in range(1, len(topics)):  # a topic's padding made non-zero, or the topic cut short
        dirty = bytearray(topics[i])
        dirty[0] ^= 0x80
        out.append({**log, "topics": [*topics[:i], HexBytes(bytes(dirty)), *topics[i + 1 :]]})
        out.append({**log, "topics": [*topics[:i], HexBytes(bytes(topics[i])[:31]), *topics[i + 1 :]]})
    for word in range(len(data) // 32):  # each data word's first byte flipped: padding, offsets, lengths
        dirty = bytearray(data)
        dirty[32 * word] ^= 0xFF
        out.append({**log, "data": HexBytes(bytes(dirty))})
    return out


@pytest.mark.parametrize("artifact", ARTIFACTS)
def test_a_broken_log_is_never_answered_where_web3_refuses_it_or_answers_otherwise(artifact):
    abi, contract, decoder = _both(artifact)
    rng = random.Random(11)
    answered = refused = 0
    for event in (e for e in abi if e["type"] == "event"):
        for _ in range(3):
            for broken in _mutations(log_entry_formatter(_raw_log(event, rng)), rng):
                try:
                    ours = decoder.decode(broken)
                except FALLS_BACK:
                    refused += 1  # the client asks web3 then: its own answer or error
                    continue
                _same(ours, _web3(contract, event["name"], broken))  # web3 raising here fails the test
                answered += 1
    assert refused > 0 and answered > 0  # both paths were taken: the mutations reach the checks


def _committed(rng: random.Random) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    abi = _abi("PipelinedLedger.json")
    event = next(e for e in abi if e["type"] == "event" and e["name"] == "Committed")
    return abi, log_entry_formatter(_raw_log(event, rng))


def test_what_the_decoder_leaves_to_web3():
    """Hex strings (web3 reads them its own way), an overloaded event (the client names events by
    name), an event entry that does not say whether it is anonymous: the decoder refuses, web3 decides."""
    abi, log = _committed(random.Random(3))
    decoder = EventDecoder(abi)
    for text in (
        {**log, "topics": ["0x" + bytes(t).hex() for t in log["topics"]]},
        {**log, "data": "0x" + bytes(log["data"]).hex()},
        {**log, "data": "0x " + bytes(log["data"]).hex()},  # bytes.fromhex would skip the blank
        {**log, "topics": iter(log["topics"])},
    ):
        with pytest.raises(ValueError):
            decoder.decode(text)
    event = next(e for e in abi if e["type"] == "event" and e["name"] == "Committed")
    overloaded = [*abi, {**event, "inputs": event["inputs"][:2]}]
    unsaid = [e for e in abi if e is not event] + [{k: v for k, v in event.items() if k != "anonymous"}]
    for other in (overloaded, unsaid):
        with pytest.raises(ValueError, match="not a log of an event this decoder knows"):
            EventDecoder(other).decode(log)
    assert EventDecoder(abi).decode(log)["event"] == "Committed"


def test_a_log_no_decoder_reads_is_a_ledger_error():
    """A `bytes` length past 2**63 is an OverflowError in eth_abi, web3's as well as the decoder's:
    the client says the endpoint's log does not decode (LedgerError) rather than let it escape."""
    abi, log = _committed(random.Random(5))
    data = bytearray(log["data"])
    offset = int.from_bytes(data[5 * 32 : 6 * 32], "big")  # the mechanism's: the sixth head word
    data[offset : offset + 32] = (2**64).to_bytes(32, "big")
    bomb = {**log, "data": HexBytes(bytes(data))}
    with pytest.raises(OverflowError):
        EventDecoder(abi).decode(bomb)
    client = SimpleNamespace(
        _events=EventDecoder(abi),
        contract=Web3().eth.contract(address=ADDRESS, abi=abi),
        _events_by_signature={"0x" + bytes(log["topics"][0]).hex(): "Committed"},
        address=ADDRESS,
    )
    with pytest.raises(LedgerError, match="a Committed log of .* that does not decode"):
        PipelinedClient._decode(client, bomb)  # type: ignore[arg-type]
    assert PipelinedClient._decode(client, log)["event"] == "Committed"  # type: ignore[arg-type]
