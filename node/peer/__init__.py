"""One swarm peer: the round state machine (`peer`) and its rooms (`watch`: the chain; `spending`:
the privacy spent; `training`; `vetting`: the rulebook; `catchup`: the finalized model; `fetching`:
a blob from its holders; `agree`: the inclusion set; `registry`: who may talk to the peer), the
narrow interfaces it needs from the ledger, the host and the store (`ports`), the `swarm node`
process (`runner`) and test-only faults."""
