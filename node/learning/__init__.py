"""Local learning: datasets and their static metadata, partitions, models, training (plain SGD
and DP-SGD through opacus), and a peer's contribution to one round. No network, no chain."""
