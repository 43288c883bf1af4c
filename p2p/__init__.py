"""libp2p transport: identity, gossip announcements, chunked content-addressed blob exchange.
Knows nothing of models, DP or the chain: it moves bytes named by sha256 digests."""
