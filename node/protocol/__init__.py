"""What every peer and `swarm verify` must compute byte for byte: blobs (canonical safetensors),
the exact aggregation rules, the wire formats (eps fixed point, inclusion bitmap, topic) and the
settings records. Depends on `mechanisms` only; knows nothing of training, chain or network."""
