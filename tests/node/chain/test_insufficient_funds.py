""" "insufficient funds" names the address and an amount also when the node refuses already at the gas
estimate (some nodes check the balance there; Anvil and Ganache do not, so the refusal is put in
front of a real Anvil by a JSON-RPC proxy on 127.0.0.1 answering eth_estimateGas from the poor
account with geth's error text; everything else, the deployment and the sends, goes to Anvil).

Two kinds of node: one that refuses only an estimate made at its own gas price (an estimate at gas
price 0 then gives the gas), and one that refuses every estimate (then a fixed bound per kind of
transaction, FALLBACK_GAS, gives it)."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from eth_account import Account

from node.chain.client import LedgerClient, connect
from node.chain.registration import sign_registration
from node.chain.sender import FALLBACK_GAS, GAS_MARGIN, GAS_PAD, InsufficientFunds, _eth


@contextmanager
def refusing_proxy(target: str, poor: str, *, refuse_zero_price: bool) -> Iterator[str]:
    """A JSON-RPC endpoint forwarding to `target`, except eth_estimateGas from `poor`, refused for
    want of funds (at gas price 0 too when `refuse_zero_price`). Yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = json.loads(body)
            params = request.get("params") or [{}]
            call = params[0] if isinstance(params[0], dict) else {}
            zero_price = int(str(call.get("gasPrice", "0x1")), 16) == 0
            if (
                request.get("method") == "eth_estimateGas"
                and str(call.get("from", "")).lower() == poor.lower()
                and (refuse_zero_price or not zero_price)
            ):
                error = {
                    "code": -32000,
                    "message": f"insufficient funds for gas * price + value: address {poor} have 0",
                }
                answer = json.dumps({"jsonrpc": "2.0", "id": request.get("id"), "error": error}).encode()
            else:
                forwarded = urllib.request.Request(target, body, {"Content-Type": "application/json"})
                with urllib.request.urlopen(forwarded, timeout=30) as response:
                    answer = response.read()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("refuse_zero_price", [False, True], ids=["estimate-at-price-0", "fixed-bound"])
def test_refused_at_the_estimate_still_names_the_amount(automine_chain, kit, refuse_zero_price):
    """The amount is the gas limit the transaction would be sent with (estimate x margin + pad)
    times its fee per gas, at least the chain's gas price."""
    w3 = connect(automine_chain.url)
    swarm = kit.Swarm(automine_chain, 1)
    poor = Account.create()
    key = kit.identity(7)
    peer_id = kit.peer_id_of_key(key)
    signature = sign_registration(key, automine_chain.chain_id, swarm.address, poor.address)
    with refusing_proxy(automine_chain.url, poor.address, refuse_zero_price=refuse_zero_price) as url:
        proxied = connect(url)
        with pytest.raises(InsufficientFunds) as register:
            LedgerClient(proxied, swarm.address, poor, tx_timeout=30).register(peer_id, signature)
        with pytest.raises(InsufficientFunds) as deploy:
            LedgerClient.deploy(proxied, poor, tx_timeout=30, **swarm.params)
    assert w3.eth.get_transaction_count(poor.address) == 0  # nothing was sent
    if refuse_zero_price:
        gas = {"register": FALLBACK_GAS["call"], "deploy": FALLBACK_GAS["deploy"]}
    else:  # what the node estimates without a balance check
        gas = {
            "register": swarm.reader.contract.functions.register(peer_id, signature).estimate_gas(
                {"from": poor.address}
            ),
            "deploy": swarm.deployer.gas_used["deploy"],  # the same constructor deployed for real: its gas used
        }
    price = int(w3.eth.gas_price)
    for label, error in (("register", register.value), ("deploy", deploy.value)):
        needed = error.fields["needed_wei"]
        assert error.fields["address"] == poor.address and error.fields["held_wei"] == 0
        assert f"insufficient funds: account {poor.address} holds 0 ETH, {label} needs up to {_eth(needed)}: " in str(
            error
        ), error
        assert str(error).endswith(f"send ETH to {poor.address} and retry")
        limit = int(gas[label] * GAS_MARGIN) + GAS_PAD
        if label == "register" or refuse_zero_price:
            assert needed % limit == 0 and needed // limit >= price, (label, needed, limit, price)
        else:  # the deployment's estimate is close to its gas used: its limit, at register's fee per gas
            fee = register.value.fields["needed_wei"] // (int(gas["register"] * GAS_MARGIN) + GAS_PAD)
            assert needed % fee == 0 and abs(needed // fee - limit) < 0.1 * limit, (needed // fee, limit)
