"""The chain side: the SwarmLedger client (records, errors, retries, revert decoding,
transaction sending), the compiled contract artifact (package data), a local Anvil, and keys."""
