"""What a peer has spent of its privacy, and whether it may spend more: its commits on chain are
what it released, so they are the accountants' history; the record-level accountant's file
(DP-SGD) is kept in step with them, and a commit that would pass the swarm's caps is not made.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from mechanisms.record_level import RecordAccountant
from node.chain.records import SwarmParams
from node.peer.ports import LedgerPort, OffLoop
from node.protocol import policy, wire
from node.protocol.policy import PrivacySpend
from node.protocol.settings import PeerSettings
from node.runfiles import write_json_atomic

log = logging.getLogger("swarm.peer")


class BudgetExhausted(Exception):
    """The next commit would pass the swarm's eps cap."""


class Spending:
    """The peer's released rounds (`counts`: the numSamples of each of its commits, oldest first,
    as on chain) and the record-level accountant kept at `accountant_path`."""

    def __init__(
        self,
        settings: PeerSettings,
        num_params: int,
        *,
        ledger: LedgerPort,
        address: str,
        call: OffLoop,
        accountant_path: Path | None,
    ) -> None:
        self.s = settings
        self.num_params = num_params
        self.ledger = ledger
        self.address = address
        self._call = call  # the peer's `chain`: ledger reads, and the accountants' computations
        self.accountant_path = accountant_path  # where the record-level accountant is kept (DP-SGD)
        self.counts: list[int] = []
        self._params: SwarmParams | None = None  # the ledger's caps: immutable (set at deploy), read once

    @property
    def commits(self) -> int:
        """Rounds this peer has committed in: the accountant's T."""
        return len(self.counts)

    async def resume(self) -> None:
        """Continue from the chain after a (re)start. A saved accountant file that says otherwise
        (a crash between a commit and the save) is reported and rewritten."""
        self.counts = await self._counts_on_chain()
        if self.s.dp is None or self.accountant_path is None:
            return
        if self.accountant_path.exists():
            from_chain = self._record_accountant()
            try:
                saved = RecordAccountant.from_dict(json.loads(self.accountant_path.read_text()))
            except (OSError, ValueError) as exc:
                log.warning("accountant file %s unreadable (%s): rebuilt from the chain", self.accountant_path, exc)
            else:
                if saved.history != from_chain.history:
                    log.warning(
                        "accountant file %s holds %d round(s), the chain %d: the chain's commits are what was "
                        "released, so the accountant continues from them",
                        self.accountant_path,
                        len(saved.history),
                        len(from_chain.history),
                    )
        self._save_accountant()

    async def resync(self) -> None:
        """After a commit that failed without a clear refusal (the RPC went away while it was being
        sent), take our commits from the chain again: if it landed after all, its eps is spent and
        the accountant must count it."""
        counts = await self._counts_on_chain()
        if len(counts) != self.commits:
            log.warning(
                "the chain holds %d commit(s) of ours, not %d: continuing from the chain", len(counts), self.commits
            )
            self.counts = counts
            self._save_accountant()

    async def next_spend(self, r: int, num_records: int) -> PrivacySpend:
        """What committing round r with `num_records` training records brings this peer's spend to
        (`policy.privacy_spend`: both figures and the micro-eps the ledger records); raises
        BudgetExhausted if either would pass the swarm's cap."""
        counts = self._next(num_records)
        spent = await self._call(policy.privacy_spend, self.s.shared.privacy, self.num_params, counts)
        if self._params is None:
            self._params = await self._call(self.ledger.params)
        params = self._params
        for what, micro, cap in (
            (
                f"eps to {wire.eps_from_micro(spent.eps_micro):.6g} ({spent.mechanism.protects})",
                spent.eps_micro,
                params.eps_cap_micro,
            ),
            (
                f"record-level eps to {wire.eps_from_micro(spent.record_eps_micro):.6g}",
                spent.record_eps_micro,
                params.record_eps_cap_micro,
            ),
        ):
            if micro > cap:
                raise BudgetExhausted(
                    f"committing round {r} would bring {what}, past the swarm's cap "
                    f"{wire.eps_from_micro(cap):.6g}: this peer stops contributing"
                )
        return spent

    def committed(self, num_records: int) -> None:
        """A commit with `num_records` records is on chain: its spend counts from now on."""
        self.counts = self._next(num_records)
        self._save_accountant()

    def _next(self, num_records: int) -> list[int]:
        return [*self.counts, int(num_records)]

    async def _counts_on_chain(self) -> list[int]:
        history = await self._call(self.ledger.commit_history, self.address)
        return [int(c.num_samples) for c in history]

    def _record_accountant(self) -> RecordAccountant:
        accountant = RecordAccountant()
        if self.s.dp is not None:
            for n in self.counts:
                accountant.step_round(self.s.dp, n)
        return accountant

    def _save_accountant(self) -> None:
        if self.s.dp is None or self.accountant_path is None:
            return
        accountant = self._record_accountant()
        eps, delta = accountant.get_privacy_spent(self.s.dp.delta)
        state = accountant.to_dict() | {"policy": self.s.dp.to_dict(), "epsilon": eps, "delta": delta}
        write_json_atomic(self.accountant_path, state)
