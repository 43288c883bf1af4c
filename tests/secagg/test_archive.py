"""What a round's archive gives away: the sum, and no survivor's update.

The archive (every KEYS, DEALING, MASKED and REVEAL frame) plus every value the reveals open lets
anyone rebuild the survivors' self-mask seeds and the dropped members' mask keys, hence strip
from a survivor's masked vector its self-mask and its pairwise masks with dropped members. What
stays on y_u is x_u plus its pairwise masks with the other survivors, whose seeds need u's or w's
mask key: no share of a survivor's mask key is ever revealed. The test checks that, and then
constructs, for every survivor u, another world with u's update changed (and one other
survivor's, by the opposite amount) and one unrevealed pairwise mask changed to match, in which
every archived byte and every revealed value is the same: the archive cannot tell the two apart.
"""

from __future__ import annotations

import numpy as np

from mechanisms.secagg import masks
from mechanisms.secagg import messages as m
from mechanisms.secagg.member import sum_residues
from mechanisms.secagg.quantize import add_mod, sub_mod, wrap
from mechanisms.secagg.unmask import verify_round
from tests.secagg.harness import BITS, DIM, Played, Swarm, play


def pair_masks(played: Played, u: int) -> dict[int, np.ndarray]:
    """u's pairwise masks PRG(s_uv) with every other member v of U2 (from u's own secrets)."""
    setup, state = played.swarm.setup, played.states[u]
    publics = {v: played.states[v].mask_key.public for v in played.dealt}
    return {
        v: masks.expand(masks.pair_seed(state.mask_key.private, publics[v], setup.session, u, v), DIM, BITS, "pair")
        for v in played.dealt
        if v != u
    }


def masked_from(played: Played, u: int, x: np.ndarray, pairs: dict[int, np.ndarray]) -> np.ndarray:
    y = add_mod(x, masks.expand(played.states[u].self_seed, DIM, BITS, "self"), BITS)
    for v, mask in pairs.items():
        y = add_mod(y, mask, BITS) if u < v else sub_mod(y, mask, BITS)
    return y


def revealed(played: Played) -> list[m.Opening]:
    setup = played.swarm.setup
    return [
        o
        for raw in played.archive.reveals.values()
        for o in m.read_reveal(m.open_frame(raw, m.Kind.REVEAL, setup.session, setup.signing))
    ]


def test_the_archive_and_every_revealed_value_leave_each_survivor_masked():
    played = play(Swarm(10), drop_before={"mask": {2, 7}, "reveal": {4}}, seed=3)
    setup = played.swarm.setup
    result = verify_round(setup, played.archive)
    alive = set(result.survivors)
    assert alive == set(range(10)) - {2, 7} and np.array_equal(
        result.total, sum_residues([played.inputs[u] for u in sorted(alive)], BITS)
    )
    openings = revealed(played)
    # no share of a survivor's mask key is in the archive: even t - 1 colluders, adding the
    # shares they hold, stay below t (they hold t - 1)
    for u in alive:
        assert not [o for o in openings if o.dealer == u and o.secret is m.Secret.MASK_KEY]
    # what the observer can strip: self-masks (seeds rebuilt from the reveals) and the pairwise
    # masks with dropped members (their keys rebuilt); the residual is x_u plus masks it cannot make
    frames = {u: m.open_frame(played.archive.masked[u], m.Kind.MASKED, setup.session, setup.signing) for u in alive}
    archived = {u: m.read_masked(frame, BITS, DIM) for u, frame in frames.items()}
    residual = {}
    for u in alive:
        pairs = pair_masks(played, u)
        strippable = {v: mask for v, mask in pairs.items() if v not in alive}
        residual[u] = masked_from(played, u, np.zeros(DIM, dtype=np.int64), strippable)
        residual[u] = sub_mod(archived[u], residual[u], BITS)  # = x_u + masks with other survivors
        hidden = sub_mod(residual[u], played.inputs[u], BITS)
        assert np.count_nonzero(hidden == 0) < 3  # ~DIM / 2^32 zeros by chance
    # the residuals sum to the plain sum: the survivors' masks cancel, only the total comes out
    assert np.array_equal(sum_residues(list(residual.values()), BITS), result.total)

    # another world, for every survivor u: x_u + delta, x_w - delta (w another survivor), and
    # PRG(s_uw) moved by delta; every masked vector, hence the whole archive, is the same
    rng = np.random.default_rng(11)
    order = sorted(alive)
    for i, u in enumerate(order):
        w = order[(i + 1) % len(order)]
        delta = rng.integers(0, 2**BITS, DIM, dtype=np.int64)
        pairs_u, pairs_w = pair_masks(played, u), pair_masks(played, w)
        assert np.array_equal(pairs_u[w], pairs_w[u])  # one seed, agreed by both
        moved = sub_mod(pairs_u[w], delta, BITS) if u < w else add_mod(pairs_u[w], delta, BITS)
        x_u, x_w = add_mod(played.inputs[u], delta, BITS), sub_mod(played.inputs[w], delta, BITS)
        assert np.array_equal(masked_from(played, u, x_u, {**pairs_u, w: moved}), archived[u])
        assert np.array_equal(masked_from(played, w, x_w, {**pairs_w, u: moved}), archived[w])
        assert not np.array_equal(wrap(x_u, BITS), played.inputs[u])
