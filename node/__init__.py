"""The swarm peer: config, data and partitions, models, local training, the round state
machine, aggregation, the ledger client and the `swarm` CLI. Nothing imports `node`."""
