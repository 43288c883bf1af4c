"""The cost of a secure-aggregation round (mechanisms.secagg: round, unmask) per member: bytes
sent and received against today's exchange, and CPU by step.

Bytes, for d = 40,000 and n = 10, 30, 100: the frames of a real in-process round, counted as a
swarm moves them. Today every peer publishes one update blob (node.protocol.wire.update_blob:
canonical safetensors, float32, the default PNPM policy's metadata) and fetches the n - 1 others;
the swarm uploads n(n - 1) blobs, so the mean peer sends n - 1 and receives n - 1 (the round
bench's 'busiest upload / (blob x N)'). Under secure aggregation each member publishes KEYS (a pair
key per member), a DEALING (commitments), a MASKED vector and a REVEAL to the n - 1 others the
same way, and sends one SEALED frame to each of the n - 1 other holders. An honest round has no
COMPLAINT frame. Chain transactions are left out of both.

CPU, at n = 10, 30, 100 (and 200, for the fit), d = 40,000, 10% of the members dropping after
dealing (the costly case: their pairwise masks are restored by everyone): process CPU time of one
member, one torch thread, by step: keys (R0 and checking U1's KEYS), dealings (dealing, checking
U2's DEALINGs, opening its SEALED shares, settling the complaints: none), quantize (stochastic
rounding), noise (its discrete Gaussian share at the 100-peer example's policy), masking (R2) and
unmasking (checking U3's MASKED frames, its REVEAL, and `unmask_round` on the REVEAL frames).
Fastest of `--repeat` rounds per step. The all-pairs part (everything but quantize and noise) is
fitted as a + b n + c n^2 to say where it passes the 0.5 s target, beyond which SecAgg+ (Bell et
al. 2020: k = O(log n) neighbours) takes over.

    python scripts/bench_secagg.py [--dim 40000] [--repeat 3] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

from benchdoc import machine_line, table, write_section  # noqa: E402

from mechanisms.randomness import seeded_generator  # noqa: E402
from mechanisms.secagg import complaints as c  # noqa: E402
from mechanisms.secagg import messages as m  # noqa: E402
from mechanisms.secagg import round as r  # noqa: E402
from mechanisms.secagg.masks import session_id  # noqa: E402
from mechanisms.secagg.policy import SecAggPolicy  # noqa: E402
from mechanisms.secagg.quantize import stochastic_round, wrap  # noqa: E402
from mechanisms.secagg.unmask import RoundArchive, survivors, unmask_round, verify_round  # noqa: E402
from node.protocol import wire  # noqa: E402

CPU_TARGET = 0.5  # s per member and round at n = 100, d = 40,000, 10% dropouts
BYTES_TARGET = 1.2  # x today's exchange
STEPS = ("keys", "dealings", "quantize", "noise", "masking", "unmasking")
FRAMES = ("KEYS", "DEALING", "SEALED", "MASKED", "REVEAL")
T = TypeVar("T")


class StepClock:
    """Process CPU seconds of the timed member's calls, by step."""

    def __init__(self) -> None:
        self.spent = dict.fromkeys(STEPS, 0.0)

    def time(self, step: str, call: Callable[[], T]) -> T:
        start = time.process_time()
        out = call()
        self.spent[step] += time.process_time() - start
        return out

    def member(self, index: int, step: str, call: Callable[[], T]) -> T:
        """`call` for member `index`, timed if it is the timed member (0)."""
        return self.time(step, call) if index == 0 else call()


def play(n: int, dim: int, dropped: set[int], clock: StepClock) -> dict[str, int]:
    """One round of n members in-process; member 0's calls are timed. Returns member 0's frame sizes."""
    signing = [Ed25519PrivateKey.generate() for _ in range(n)]
    setup = r.RoundSetup.for_members(
        session_id(b"bench", 1, chain_id=1, ledger=bytes(20)),
        {i: k.public_key() for i, k in enumerate(signing)},
        32,
        dim,
        counted_members=n - len(dropped),
    )
    policy = SecAggPolicy(
        members=100, max_records=60_000, dim=dim, clip=0.1, noise_multiplier=7.466, dropout_fraction=0.1
    )
    rng = np.random.default_rng(n)
    run = clock.member

    states, key_frames = {}, {}
    for i in range(n):
        states[i], key_frames[i] = run(i, "keys", partial(r.start, setup, i, signing[i]))
    keys, _ = run(0, "keys", lambda: r.key_set(setup, key_frames))
    dealings: dict[int, bytes] = {}
    sealed_to: dict[int, dict[int, bytes]] = {h: {} for h in range(n)}
    bundles: dict[int, dict[int, bytes]] = {}  # dealer -> holder -> SEALED frame
    for i in range(n):
        dealings[i], sealed = run(i, "dealings", partial(r.deal, states[i], setup, keys))
        bundles[i] = sealed
        for h, frame in sealed.items():
            sealed_to[h][i] = frame
    candidates, _ = run(0, "dealings", lambda: r.dealt_set(setup, keys, dealings))
    for i in range(n):
        run(i, "dealings", partial(r.receive, states[i], setup, keys, candidates, bundles))
    dealt, _ = run(0, "dealings", lambda: c.settle(setup, keys, candidates, {}, {}))

    gradient = rng.normal(0, 0.01, dim) * 60_000 / 100
    stream = seeded_generator(0)
    rounded = clock.time("quantize", lambda: stochastic_round(gradient * policy.scale, stream.mechanism))
    noise = clock.time("noise", lambda: policy.local_noise.sample(dim, stream.dpsgd_noise))
    residues = {i: rng.integers(0, 2**32, dim, dtype=np.int64) for i in range(1, n)}
    residues[0] = clock.time("quantize", lambda: wrap(rounded + noise, 32))
    masked = {}
    for i in range(n):
        if i not in dropped:
            masked[i] = run(i, "masking", partial(r.masked_vector, states[i], setup, keys, dealt, residues[i]))
    vectors, _ = clock.time("unmasking", lambda: survivors(setup, dealt, masked))
    reveals = {i: r.reveal(states[i], setup, dealt, vectors) for i in range(1, n) if i not in dropped}
    reveals[0] = clock.time("unmasking", lambda: r.reveal(states[0], setup, dealt, vectors))
    result = clock.time("unmasking", lambda: unmask_round(setup, keys, dealt, vectors, reveals, {}))
    archived = {i: m.dealing_bundle(dealings[i], bundles[i]) for i in dealings}
    audit = verify_round(setup, RoundArchive(key_frames, archived, masked, reveals))
    if not np.array_equal(audit.total, result.total):
        raise RuntimeError("verify_round disagrees with the member's unmasking")
    expected = wrap(np.sum([residues[i] for i in result.survivors], axis=0), 32)
    if not np.array_equal(result.total, expected) or result.faults:
        raise RuntimeError("the benchmark's round did not unmask to the plain sum")
    return {
        "KEYS": len(key_frames[0]),
        "DEALING": len(dealings[0]),
        "SEALED": len(sealed_to[1][0]),
        "MASKED": len(masked[0]),
        "REVEAL": len(reveals[0]),
    }


def today_blob(dim: int) -> int:
    mechanism = wire.canonical({"name": "pnpm", "epsilon": 1.0})
    return len(wire.update_blob(torch.zeros(dim), 1, mechanism, "0x" + "ab" * 20))


def bytes_section(dim: int, sizes: dict[int, dict[str, int]]) -> tuple[str, list[float]]:
    blob = today_blob(dim)
    rows, ratios = [], []
    for n, size in sorted(sizes.items()):
        today = 2 * (n - 1) * blob
        ours = 2 * (n - 1) * sum(size.values())
        ratios.append(ours / today)
        rows.append(
            [n, *(f"{size[f]:,}" for f in FRAMES), f"{blob:,}", f"{today / 1e6:.2f}", f"{ours / 1e6:.2f}"]
            + [f"**{ours / today:.3f}x**"]
        )
    headers = ["n", *(f"{f} B" for f in FRAMES), "today: update blob B", "today MB / member", "secagg MB / member"]
    return table(headers + ["ratio"], rows), ratios


def fit_crossing(cpu: dict[int, dict[str, float]]) -> tuple[np.ndarray, int | None]:
    """Least squares a + b n + c n^2 to the all-pairs CPU, and the first n where the member's total
    (with n = 100's quantize and noise) passes the target."""
    ns = np.array(sorted(cpu), dtype=float)
    pairs = np.array([sum(cpu[int(n)][s] for s in STEPS if s not in ("quantize", "noise")) for n in ns])
    coef = np.polyfit(ns, pairs, 2)[::-1]
    fixed = cpu[100]["quantize"] + cpu[100]["noise"] if 100 in cpu else 0.0
    for n in range(2, 5000):
        if fixed + coef[0] + coef[1] * n + coef[2] * n * n > CPU_TARGET:
            return coef, n
    return coef, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=40_000)
    ap.add_argument("--members", type=int, nargs="+", default=[10, 30, 100, 200])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sizes: dict[int, dict[str, int]] = {}
    cpu: dict[int, dict[str, float]] = {}
    for n in args.members:
        dropped = set(range(n - n // 10, n))  # 10%, after dealing
        best = dict.fromkeys(STEPS, float("inf"))
        for _ in range(args.repeat):
            clock = StepClock()
            sizes[n] = play(n, args.dim, dropped, clock)
            best = {s: min(best[s], clock.spent[s]) for s in STEPS}
        cpu[n] = best
        print(f"n={n}: " + ", ".join(f"{s} {best[s] * 1e3:.1f} ms" for s in STEPS), flush=True)
    md = render(args.dim, sizes, cpu)
    print(md)
    if not args.no_write:
        write_section("secagg", md)
    return 0


def render(dim: int, sizes: dict[int, dict[str, int]], cpu: dict[int, dict[str, float]]) -> str:
    bytes_table, ratios = bytes_section(dim, {n: s for n, s in sizes.items() if n <= 100})
    cpu_rows = [
        [n, *(f"{cpu[n][s] * 1e3:.1f}" for s in STEPS), f"**{sum(cpu[n].values()) * 1e3:.0f}**"] for n in sorted(cpu)
    ]
    coef, crossing = fit_crossing(cpu)
    at100 = sum(cpu[100].values()) if 100 in cpu else float("nan")
    noise_share = cpu[100]["noise"] / at100 if 100 in cpu else float("nan")
    return "\n".join(
        [
            "## Secure aggregation (`scripts/bench_secagg.py`, `swarm bench secagg`)",
            "",
            f"{machine_line()}; one torch thread. Frames of a real in-process round (mechanisms.secagg.round, "
            f"unmask), d = {dim:,}, 32 bits. Per member and round, sent + received: today 2(n - 1) update blobs "
            "(node.protocol.wire.update_blob, float32 safetensors, the default PNPM policy: each peer publishes one "
            "and fetches the n - 1 others); under secure aggregation 2(n - 1) x (KEYS + DEALING + MASKED + REVEAL, "
            "published the same way, and one SEALED frame to each other holder). Chain transactions left out of both.",
            "",
            bytes_table,
            "",
            f"Bytes: at most {max(ratios):.3f}x today's exchange (target <= {BYTES_TARGET}x: "
            f"{'met' if max(ratios) <= BYTES_TARGET else 'NOT met'}). The masked vector is 4 bytes a coordinate, as a "
            "float32 blob; the KEYS (32 bytes per member: a pair key each), the DEALING (66 bytes per member of U1) "
            "and the REVEAL (52 bytes per member of U2) grow with n.",
            "",
            "CPU seconds of one member (process CPU time, fastest of the repeats per step), 10% of the members "
            "dropping after dealing (their pairwise masks restored by every member that unmasks); noise: the "
            "member's discrete Gaussian share at the 100-peer example's policy (noise multiplier 7.466, "
            "dropout fraction 0.1); unmasking: opening the MASKED frames (U3), its REVEAL, and `unmask_round` on "
            "the REVEAL frames (checking every revealed share against its commitment, rebuilding the secrets, "
            "restoring the dropped members' pairwise masks: 0.1 n x 0.9 n X25519 agreements and ChaCha20 "
            "expansions of d words, the quadratic term); the bench checks that `verify_round` on the archive agrees. "
            f"1-minute load average at the end of the run: {os.getloadavg()[0]:.1f} (other jobs on this machine "
            "inflate CPU time less than wall time, but not to nothing).",
            "",
            table(["n", *(f"{s} ms" for s in STEPS), "total ms"], cpu_rows),
            "",
            f"At n = 100: **{at100:.3f} s** per member and round (target <= {CPU_TARGET} s: "
            f"{'met' if at100 <= CPU_TARGET else 'NOT met'}); the discrete Gaussian sampler is "
            f"{noise_share:.0%} of it. All-pairs part (all but quantize and noise) fitted as "
            f"{coef[0] * 1e3:.1f} + {coef[1] * 1e3:.3f} n + {coef[2] * 1e6:.2f}e-3 n^2 ms: "
            + (
                f"with the noise and rounding of n = 100 the member passes {CPU_TARGET} s at **n = {crossing}**, "
                "where a sparse neighbour graph (SecAgg+, Bell et al. 2020: k = O(log n) neighbours, so n replaced "
                "by k in every all-pairs term) takes over."
                if crossing
                else "below the target up to n = 5,000."
            ),
            "Reproduce: `swarm bench secagg` (or `python scripts/bench_secagg.py`).",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
