"""The peer's local training: one at a time on its model (opacus hooks into it), and the next
round's started early, on the peer's own aggregate, while the round waits for its majority.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import trio

from node.peer.ports import OffLoop

log = logging.getLogger("swarm.peer")

# Round r's perturbed update from the model given, and the number of records it trained on (blocking).
Train = Callable[[int, torch.Tensor], tuple[torch.Tensor, int]]


@dataclass
class Trained:
    vector: torch.Tensor
    num_samples: int
    started: float  # wall clock (Unix time): a speculation starts before its round opens
    ended: float


@dataclass
class Speculation:
    """The next round's training, started on this peer's own aggregate as soon as it attested,
    while the round waits for its majority. Used only if the round finalizes exactly that model
    (`base`); otherwise dropped unseen: nothing of it was released, so it spent no privacy."""

    round: int
    base: bytes  # digest of the aggregate it trains from
    done: trio.Event = field(default_factory=trio.Event)
    result: tuple[torch.Tensor, int] | None = None
    started: float = 0.0
    ended: float = 0.0


class Training:
    """Runs `train` off the loop for rounds up to `last_round`, one training at a time."""

    def __init__(self, train: Train, off_loop: OffLoop, *, last_round: int) -> None:
        self._train = train
        self._off_loop = off_loop
        self.last_round = last_round
        self.speculation: Speculation | None = None
        self._model_in_use = trio.Lock()

    def speculate(
        self, background: trio.Nursery | None, next_round: int, own: tuple[int, bytes, torch.Tensor] | None
    ) -> None:
        """Start training `next_round` in `background` on `own`, the (round, digest, vector) of the
        aggregate we just attested, while the majority forms (the round's wait, the model's
        evaluation and the next round's opening then overlap it)."""
        self.speculation = None
        if background is None or own is None or own[0] != next_round - 1 or next_round > self.last_round:
            return
        spec = Speculation(round=next_round, base=own[1])
        self.speculation = spec
        background.start_soon(self._run_speculation, spec, own[2])

    async def _run_speculation(self, spec: Speculation, base: torch.Tensor) -> None:
        try:
            async with self._model_in_use:
                spec.started = time.time()
                spec.result = await self._off_loop(self._train, spec.round, base)
        except Exception as exc:  # the round's own training runs instead, and raises what it raises
            log.warning("round %d: speculative training failed: %s", spec.round, exc)
        finally:
            spec.ended = time.time()
            spec.done.set()

    async def trained(self, r: int, global_vector: torch.Tensor, model_digest: bytes | None) -> Trained:
        """Round r's perturbed update: the speculation's if it trained from the model we hold
        (`model_digest`), else trained now from `global_vector`."""
        spec, self.speculation = self.speculation, None
        if spec is not None and spec.round == r and spec.base == model_digest:
            await spec.done.wait()
            if spec.result is not None:
                return Trained(*spec.result, started=spec.started, ended=spec.ended)
        async with self._model_in_use:  # a dropped speculation may still be training: one at a time
            started = time.time()
            vector, num_samples = await self._off_loop(self._train, r, global_vector)
            return Trained(vector, num_samples, started=started, ended=time.time())
