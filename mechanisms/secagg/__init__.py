"""Secure aggregation with distributed DP: the arithmetic (no network).

Each member turns its clipped gradient sum into integers modulo 2^bits (`quantize`), adds its share
of discrete Gaussian noise drawn exactly from a ChaCha20 stream (`discrete_gaussian`), and hides the
result under pairwise masks from X25519-agreed seeds and a self-mask (`masks`), whose seeds are
Shamir-shared over a 257-bit prime field (`shamir`) so the sum survives dropouts. Every message is
framed with explicit lengths and signed with Ed25519 (`messages`). `round` holds a member's steps
of the protocol and `unmask` the aggregate from a round's archive, with the member whose share or
vector does not fit named (no transport in either). `accounting` gives the record-level eps of the
noisy sum (docs/SECAGG.md).
"""
