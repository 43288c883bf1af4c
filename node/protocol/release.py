"""The release rule: every update a peer aggregates must be a possible output of the swarm's
mechanism (its privacy policy, in the genesis). Peers and `swarm verify` apply it through
`node.rules`; a blob that breaks it is left out like a malformed one."""

from __future__ import annotations

import torch

import mechanisms
from mechanisms.secagg.policy import NAME as SECAGG
from node.protocol import blob, wire
from node.protocol.settings import SharedSettings


class ReleaseError(blob.BlobError):
    """An update blob that decodes, but whose values the swarm's mechanism cannot output."""


def swarm_mechanism(shared: SharedSettings) -> mechanisms.Mechanism | None:
    """The mechanism of the swarm's privacy policy (the genesis's), whose output set every update
    must fall in; None for an empty policy (a `swarm simulate` baseline: nothing to check). Raises
    ValueError when the policy builds no mechanism."""
    params = dict(shared.privacy.mechanism)
    if params.get("name") == SECAGG:  # secure aggregation shares no update blob: nothing to hold to a set
        return None
    return mechanisms.from_params(params) if params else None


def check_release(vector: torch.Tensor, mechanism: mechanisms.Mechanism | None) -> None:
    """ReleaseError (a BlobError) unless `vector` is a possible output of `mechanism`
    (`Mechanism.release_violation`: Duchi's two points, PM's interval, sampling's k non-zeros...).
    The one rule peers and `swarm verify` apply to every update: a blob that breaks it is left out
    like a malformed one, and a finalized aggregate that includes it fails verification."""
    if mechanism is None:
        return
    violation = mechanism.release_violation(vector)
    if violation is not None:
        raise ReleaseError(f"not a possible output of the swarm's mechanism {mechanism!r}: {violation}")


def read_update(data: bytes, num_params: int, mechanism: mechanisms.Mechanism | None) -> torch.Tensor:
    """An update blob's vector, if it decodes (`read_vector`, kind "update": the value bound
    included) and is a possible output of the swarm's `mechanism` (`check_release`); else
    BlobError. For re-reading blobs a finalized round included (a peer's rebuild of the model,
    checked against the finalized digest); whether a blob counts is the rulebook's
    (`node.rules.Rulebook.read_update`)."""
    vector, _ = wire.read_vector(data, num_params, kind="update")
    check_release(vector, mechanism)
    return vector
