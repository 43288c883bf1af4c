"""Local and central DP mechanisms on tensors, their guarantees, accountants and audits.
Imports torch, numpy, math and opacus only: no I/O, no network, no chain."""
