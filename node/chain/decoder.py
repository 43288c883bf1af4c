"""Revert data to exceptions: the 4-byte selectors of the ABI's custom errors mapped to the
`LedgerError` subclasses of `node.chain.errors`."""

from __future__ import annotations

from typing import Any

from eth_abi import decode as abi_decode
from eth_utils import keccak, to_checksum_address

from node.chain.errors import REFUSALS, LedgerError
from node.chain.records import RoundState


class RevertDecoder:
    """Maps 4-byte selectors of the ABI's custom errors to LedgerError subclasses."""

    def __init__(self, abi: list[dict[str, Any]]) -> None:
        self._by_selector: dict[bytes, tuple[str, list[str], list[str]]] = {}
        for item in abi:
            if item["type"] != "error":
                continue
            types = [i["type"] for i in item["inputs"]]
            selector = keccak(text=f"{item['name']}({','.join(types)})")[:4]
            self._by_selector[selector] = (item["name"], types, [i["name"] for i in item["inputs"]])

    def decode(self, data: Any) -> LedgerError | None:
        if isinstance(data, str):
            try:
                data = bytes.fromhex(data.removeprefix("0x"))
            except ValueError:
                return None
        if not isinstance(data, (bytes, bytearray)) or len(data) < 4 or bytes(data[:4]) not in self._by_selector:
            return None
        name, types, names = self._by_selector[bytes(data[:4])]
        values = abi_decode(types, bytes(data[4:]))
        fields: dict[str, Any] = {
            n: to_checksum_address(v) if t == "address" else _hex_field(v) for n, t, v in zip(names, types, values)
        }
        if "state" in fields:
            fields["state"] = RoundState(fields["state"]).name
        cls = REFUSALS.get(name)
        return cls(**fields) if cls else LedgerError(f"contract refused: {name}{fields}", **fields)

    def from_exception(self, exc: BaseException | None) -> LedgerError | None:
        """Find revert data in the exception or its causes (eth-tester nests it)."""
        seen = 0
        while exc is not None and seen < 8:
            for data in (getattr(exc, "data", None), *getattr(exc, "args", ())):
                if isinstance(data, dict):  # Ganache: {"message": ..., "result": "0x<revert data>"}
                    data = data.get("data") or data.get("result")
                found = self.decode(data)
                if found:
                    return found
            exc, seen = exc.__cause__ or exc.__context__, seen + 1
        return None


def _hex_field(value: Any) -> Any:
    return value.hex() if isinstance(value, (bytes, bytearray)) else value
