"""One swarm peer: the round state machine (`peer`), its agreement on the inclusion set
(`agree`), the narrow interfaces it needs from the ledger, the host and the store (`ports`),
the `swarm node` process (`runner`) and test-only faults."""
