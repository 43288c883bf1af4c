"""The ledger's views and events over bare JSON-RPC (`node.chain.rawrpc`), encoded and decoded
with eth_abi in the shapes web3 gives: a view's answer as its one output, a list of several, a
struct as a tuple; an event log as {"event", "args", "blockNumber", "logIndex"}; addresses
checksummed.

Why not web3: a view through web3's contract machinery costs about 6 ms of CPU, an eth_getLogs
with event decoding about 5 ms (argument normalisation, middleware, `requests`, AttributeDicts);
the same here a tenth to a fifth of that (docs/SCALING.md, "Protocol CPU per round").
"""

from __future__ import annotations

from typing import Any

from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_abi.exceptions import DecodingError, EncodingError
from eth_utils import keccak, to_checksum_address
from web3.datastructures import AttributeDict

from node.chain.errors import LedgerError
from node.chain.rawrpc import parse_quantity


def abi_type(entry: dict[str, Any]) -> str:
    """The canonical type of an ABI parameter ("(uint8,uint64)" for a struct)."""
    kind = str(entry["type"])
    if kind.startswith("tuple"):
        return "(" + ",".join(abi_type(c) for c in entry["components"]) + ")" + kind[len("tuple") :]
    return kind


def _checksummed(entry: dict[str, Any], value: Any) -> Any:
    """`value` with its addresses checksummed, as web3 gives them."""
    kind = str(entry["type"])
    if kind == "address":
        return to_checksum_address(value)
    if kind == "tuple":
        return tuple(_checksummed(c, v) for c, v in zip(entry["components"], value, strict=True))
    return value


class ViewCodec:
    """Calldata and answers of the ABI's view functions."""

    def __init__(self, abi: list[dict[str, Any]]) -> None:
        self._views: dict[str, tuple[bytes, list[str], list[str], list[dict[str, Any]]]] = {}
        for item in abi:
            if item.get("type") != "function" or item.get("stateMutability") not in ("view", "pure"):
                continue
            inputs = [abi_type(i) for i in item["inputs"]]
            selector = keccak(text=f"{item['name']}({','.join(inputs)})")[:4]
            self._views[item["name"]] = (selector, inputs, [abi_type(o) for o in item["outputs"]], item["outputs"])
        # calldata of the views without arguments, encoded once
        self._fixed = {name: "0x" + view[0].hex() for name, view in self._views.items() if not view[1]}

    def calldata(self, name: str, args: tuple[Any, ...]) -> str:
        if not args and name in self._fixed:
            return self._fixed[name]
        selector, inputs, _, _ = self._views[name]
        try:
            return "0x" + (selector + abi_encode(inputs, list(args))).hex()
        except EncodingError as exc:
            raise ValueError(f"{name}: arguments {args!r} do not fit {inputs}: {exc}") from None

    def decode(self, name: str, result: Any) -> Any:
        """The answer of an eth_call of `name`; LedgerError if it is not its ABI encoding."""
        _, _, outputs, entries = self._views[name]
        try:
            if not isinstance(result, str) or not result.startswith("0x"):
                raise ValueError("not a hex string")
            values = abi_decode(outputs, bytes.fromhex(result[2:]))
            shaped = [_checksummed(e, v) for e, v in zip(entries, values, strict=True)]
        except (ValueError, DecodingError, OverflowError) as exc:  # Overflow: a length or offset past 2**63
            raise LedgerError(f"{name}: not the view's output ({exc}): {str(result)[:200]}") from None
        return shaped[0] if len(shaped) == 1 else shaped


class EventCodec:
    """eth_getLogs queries and decoded logs of the ABI's events."""

    def __init__(self, abi: list[dict[str, Any]]) -> None:
        self._events: dict[str, tuple[str, list[dict[str, Any]], list[dict[str, Any]]]] = {}
        for item in abi:
            if item.get("type") != "event":
                continue
            signature = f"{item['name']}({','.join(abi_type(i) for i in item['inputs'])})"
            indexed = [i for i in item["inputs"] if i["indexed"]]
            data = [i for i in item["inputs"] if not i["indexed"]]
            self._events[item["name"]] = ("0x" + keccak(text=signature).hex(), indexed, data)

    def query(self, name: str, address: str, start: int, end: int, filters: dict[str, Any] | None) -> dict[str, Any]:
        """The eth_getLogs filter of `name`'s logs from `address` in blocks start..end whose
        indexed arguments equal `filters`."""
        topic0, indexed, _ = self._events[name]
        topics: list[str | None] = [topic0]
        for entry in indexed:
            value = (filters or {}).get(entry["name"])
            topics.append(None if value is None else "0x" + abi_encode([abi_type(entry)], [value]).hex())
        while topics[-1] is None:
            topics.pop()
        return {"address": address, "fromBlock": hex(start), "toBlock": hex(end), "topics": topics}

    def decode(self, name: str, logs: Any) -> list[dict[str, Any]]:
        """The eth_getLogs answer for `name`'s query, decoded; LedgerError for anything that is
        not one of its logs."""
        if not isinstance(logs, list):
            raise LedgerError(f"eth_getLogs {name}: unexpected answer {str(logs)[:200]}")
        try:
            return [self._decode_one(name, log) for log in logs]
        except (ValueError, TypeError, KeyError, DecodingError, OverflowError) as exc:  # Overflow: as in ViewCodec
            raise LedgerError(f"eth_getLogs {name}: a log that is not a {name} event ({exc})") from None

    def _decode_one(self, name: str, log: dict[str, Any]) -> dict[str, Any]:
        topic0, indexed, data = self._events[name]
        topics = log["topics"]
        if not isinstance(topics, list) or len(topics) != 1 + len(indexed) or topics[0] != topic0:
            raise ValueError(f"topics {str(topics)[:200]}")
        args: dict[str, Any] = {}
        for entry, topic in zip(indexed, topics[1:], strict=True):
            (value,) = abi_decode([abi_type(entry)], _hex_bytes(topic))
            args[entry["name"]] = _checksummed(entry, value)
        values = abi_decode([abi_type(e) for e in data], _hex_bytes(log["data"]))
        args |= {e["name"]: _checksummed(e, v) for e, v in zip(data, values, strict=True)}
        return {
            "event": name,
            "args": args,
            "blockNumber": parse_quantity(log["blockNumber"], "eth_getLogs"),
            "logIndex": parse_quantity(log["logIndex"], "eth_getLogs"),
        }


def _hex_bytes(value: Any) -> bytes:
    if not isinstance(value, str) or not value.startswith("0x"):
        raise ValueError(f"not a hex string: {str(value)[:100]}")
    return bytes.fromhex(value[2:])


# Types `EventDecoder` decodes itself: what web3 gives for them is eth_abi's value (an address checksummed).
_PLAIN_TYPES = ("address", "bool", "bytes", "string")


def _plain(kind: str) -> bool:
    """Whether an event input of type `kind` decodes as eth_abi gives it (no tuple, no array)."""
    return kind in _PLAIN_TYPES or (kind.startswith(("uint", "int", "bytes")) and kind[-1:].isdigit())


class EventDecoder:
    """web3's `ContractEvent.process_log` (web3._utils.events.get_event_data) for one ABI's events,
    with each event's types, names and signature worked out once instead of on every log.

    Why: web3 derives all of that again for every log (0.54 ms of CPU for a Committed log on the
    test machine, this 0.12 ms), and a pipelined peer decodes every log of its ledger once: about
    twenty a round at 16 peers (docs/SCALING.md, "Per task, counted"). Same output, value for
    value and type for type (tests/node/chain/test_event_decoder.py compares both on every event of
    both ledgers); `decode` raises ValueError for anything it does not decode the way web3 would
    (another event, topics that do not fit, hex strings rather than bytes, an event with tuple or
    array inputs), and the caller then asks web3, which gives its own answer or error."""

    def __init__(self, abi: list[dict[str, Any]]) -> None:
        self._events: dict[bytes, tuple[str, list[tuple[str, str]], list[str], list[str]]] = {}
        event_names = [item.get("name") for item in abi if item.get("type") == "event"]
        for item in abi:
            if item.get("type") != "event" or item.get("anonymous") is not False or event_names.count(item["name"]) > 1:
                continue  # anonymous, unsaid, or overloaded (the client names an event by its name): web3's
            inputs = item["inputs"]
            if not all(_plain(str(i["type"])) for i in inputs) or any(
                i.get("indexed") and i["type"] in ("bytes", "string") for i in inputs
            ):
                continue  # left to web3 (an indexed dynamic value is its hash in the topic)
            signature = keccak(text=f"{item['name']}({','.join(abi_type(i) for i in inputs)})")
            indexed = [(str(i["name"]), str(i["type"])) for i in inputs if i.get("indexed")]
            data = [i for i in inputs if not i.get("indexed")]
            names = [str(i["name"]) for i in data]
            if {n for n, _ in indexed} & set(names):
                continue  # a name both indexed and not: web3 refuses those (InvalidEventABI)
            self._events[signature] = (str(item["name"]), indexed, [str(i["type"]) for i in data], names)

    def decode(self, log: Any) -> Any:
        """The EventData web3 would give for `log` (an AttributeDict for an AttributeDict, else a dict)."""
        if not isinstance(log["topics"], list | tuple):
            raise ValueError("topics that are not a list")
        topics = [_as_bytes(t) for t in log["topics"]]
        if not topics or topics[0] not in self._events:
            raise ValueError("not a log of an event this decoder knows")
        name, indexed, data_types, data_names = self._events[topics[0]]
        if len(topics) != 1 + len(indexed):
            raise ValueError(f"{len(topics)} topics for {name}")
        args: dict[str, Any] = {}
        for (arg, kind), topic in zip(indexed, topics[1:], strict=True):
            (value,) = abi_decode([kind], topic)
            args[arg] = to_checksum_address(value) if kind == "address" else value
        values = abi_decode(data_types, _as_bytes(log["data"]))
        for arg, kind, value in zip(data_names, data_types, values, strict=True):
            args[arg] = to_checksum_address(value) if kind == "address" else value
        event = {
            "args": args,
            "event": name,
            "logIndex": log["logIndex"],
            "transactionIndex": log["transactionIndex"],
            "transactionHash": log["transactionHash"],
            "address": log["address"],
            "blockHash": log["blockHash"],
            "blockNumber": log["blockNumber"],
        }
        return AttributeDict.recursive(event) if isinstance(log, AttributeDict) else event


def _as_bytes(value: Any) -> bytes:
    """A topic or a log's data, as bytes (a formatted log's HexBytes); anything else, hex strings
    included (web3 reads those its own way), is left to web3."""
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    raise ValueError(f"not bytes: {str(value)[:100]}")
