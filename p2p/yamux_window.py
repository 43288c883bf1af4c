"""Yamux receive-window credit in py-libp2p 0.8.1, returned once half the window is consumed.

A yamux receiver tells the sender how many more bytes it may send (WINDOW_UPDATE frames). go-yamux
(`stream.sendWindowUpdate`) returns credit only once the consumed bytes reach half of the window, so
a stream of small messages costs one update per ~128 KiB read. py-libp2p 0.8.1's
`YamuxStream._auto_tune_and_send_window_update` has a third branch ("partial slack": consumed bytes
below the half-window threshold) that sends an update after *every* read, whatever
`PY_YAMUX_RELEASE_ON_READ` says. Every gossip RPC (a few hundred bytes) therefore cost a second,
encrypted frame back (counted in a 16-host swarm: 4,883 RPCs, 4,835 WINDOW_UPDATE frames), and
each frame costs both ends a Noise encryption, a lock and a scheduling round: docs/P2P.md, "Where
the cost grew with N".

`install()` replaces that method (a class attribute; the library is not edited) with go-yamux's
rule: no update until the consumed bytes reach `target_recv_window // 2` (py-libp2p's own
threshold, `PY_YAMUX_BATCH_THRESHOLD_DIV`), then one update for all of them, with py-libp2p's
window auto-tuning applied at that moment as before. A sender never waits for credit that is not
coming: it is blocked only after sending a whole window without credit back; less than half of
those bytes were consumed (else the credit went out), so more than half are still buffered, and
reading them carries the reader past the threshold, which sends the credit.
"""

from __future__ import annotations

from typing import Any

from libp2p.stream_muxer.yamux import yamux as _yamux


async def send_window_update_at_half(self: Any, *, bytes_read: int = 0) -> None:
    """`YamuxStream._auto_tune_and_send_window_update` with go-yamux's half-window rule only."""
    del bytes_read  # the window itself records what was consumed: target - (credit + unread)
    increment = 0
    async with self.window_lock:
        unread = len(self.conn.stream_buffers.get(self.stream_id, b""))
        consumed = self.target_recv_window - (self.recv_window + unread)
        if consumed > 0 and consumed >= self._grow_threshold():
            increment = self._grow_to_delta(unread) + self._apply_autotune_epoch(unread)
            self._pending_recv_release = 0
    if increment > 0:
        await self.send_window_update(increment, skip_lock=True)


def install() -> None:
    """Point py-libp2p's YamuxStream at `send_window_update_at_half` (idempotent)."""
    _yamux.YamuxStream._auto_tune_and_send_window_update = send_window_update_at_half  # type: ignore[method-assign]
