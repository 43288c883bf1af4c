"""Prepared keystream words for the mechanisms' exactness tests: a stand-in for a `RandomStream`
that hands out given int32 words in order, so that a test can run the real `perturb` on every
value a draw can take."""

from __future__ import annotations

from types import SimpleNamespace

import torch


class ReplayStream:
    """Hands out prepared int32 words in order (int64 buffers take two words each, low first)."""

    def __init__(self, words: torch.Tensor) -> None:
        self.words = words.to(torch.int32).contiguous() if words.dtype != torch.int32 else words.contiguous()
        self.at = 0

    def fill_(self, out: torch.Tensor) -> torch.Tensor:
        target = out.view(torch.int32).view(-1)
        n = target.numel()
        assert self.at + n <= self.words.numel(), "the mechanism read more words than prepared"
        target.copy_(self.words[self.at : self.at + n])
        self.at += n
        return out


def replay(words: torch.Tensor) -> SimpleNamespace:
    """A stand-in for a PrivacyGenerator whose mechanism stream replays `words` (int32, or int64
    viewed as two int32 words each)."""
    return SimpleNamespace(mechanism=ReplayStream(words.view(torch.int32) if words.dtype == torch.int64 else words))
