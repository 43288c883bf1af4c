"""Where privacy draws come from: ChaCha20 streams keyed from the OS, one per purpose; nothing on a
secret path constructs torch's, numpy's or Python's seedable generators or touches their global
state.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

import mechanisms
from mechanisms.randomness import PURPOSES, PrivacyGenerator, RandomStream, secret_generator, seeded_generator
from mechanisms.record_level import DPSGDPolicy
from node.learning.data import load_dataset
from node.learning.models import init_model
from node.learning.train import train_local

Z = 5.0


def test_a_stream_is_the_chacha20_keystream_of_its_purpose():
    """The bytes are RFC 8439's ChaCha20 keystream (the encryption of zeros) under the key and the
    purpose's nonce, in order, never repeated: two fills continue the stream."""
    key = bytes(range(32))
    stream = RandomStream(key, "mechanism")
    a = stream.fill_(torch.empty(100, dtype=torch.uint8)).clone()
    b = stream.fill_(torch.empty(28, dtype=torch.uint8)).clone()
    import hashlib

    nonce = bytes(4) + hashlib.blake2b(b"mechanism", digest_size=12).digest()
    expected = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor().update(bytes(128))
    assert bytes(torch.cat([a, b]).tolist()) == expected
    assert stream.drawn == 128
    other = RandomStream(key, "dpsgd-noise").fill_(torch.empty(128, dtype=torch.uint8))
    assert bytes(other.tolist()) != expected  # another purpose: another keystream


def test_secret_generators_differ_keep_no_key_and_say_so():
    draws = [bytes(secret_generator().mechanism.fill_(torch.empty(32, dtype=torch.uint8)).tolist()) for _ in range(4)]
    assert len(set(draws)) == 4
    g = secret_generator()
    assert g.secret and "secret" in repr(g)
    # nothing on the object holds the key: only the streams' cipher contexts (OpenSSL's memory)
    assert set(PrivacyGenerator.__slots__) == {"secret", "mechanism", "dpsgd_noise", "poisson", "augment"}
    assert all(not isinstance(getattr(g, s), bytes) for s in PrivacyGenerator.__slots__)
    assert "key" not in repr(g.mechanism).lower()


def test_seeded_generators_reproduce_and_are_labelled_public():
    a, b, c = seeded_generator(9), seeded_generator(9), seeded_generator(10)
    assert not a.secret and "public" in repr(a)
    fills = [bytes(g.poisson.fill_(torch.empty(64, dtype=torch.uint8)).tolist()) for g in (a, b, c)]
    assert fills[0] == fills[1] != fills[2]
    with pytest.raises(ValueError, match="seed"):
        seeded_generator("9")  # type: ignore[arg-type]


def test_purposes_are_separate_streams():
    g = seeded_generator(1)
    outputs = {
        p: bytes(getattr(g, p.replace("-", "_")).fill_(torch.empty(64, dtype=torch.uint8)).tolist()) for p in PURPOSES
    }
    assert len(set(outputs.values())) == len(PURPOSES)
    # drawing from one stream does not move another
    h = seeded_generator(1)
    h.mechanism.fill_(torch.empty(4096, dtype=torch.uint8))
    assert bytes(h.poisson.fill_(torch.empty(64, dtype=torch.uint8)).tolist()) == outputs["poisson"]


def test_words_and_below_are_uniform():
    """Byte and bit frequencies of 2^20 bytes, and `below(6)` over 60,000 draws, within 5 sd."""
    stream = seeded_generator(2).mechanism
    n = 1 << 20
    data = stream.fill_(torch.empty(n, dtype=torch.uint8)).to(torch.int64)
    counts = torch.bincount(data, minlength=256).double()
    p = 1 / 256
    assert float((counts - n * p).abs().max()) <= Z * math.sqrt(n * p * (1 - p))
    for bit in range(8):
        ones = int(((data >> bit) & 1).sum())
        assert abs(ones - n / 2) <= Z * math.sqrt(n / 4)
    draws = [stream.below(6) for _ in range(60_000)]
    for value in range(6):
        assert abs(draws.count(value) - 10_000) <= Z * math.sqrt(60_000 * (1 / 6) * (5 / 6))
    assert stream.below(1) == 0
    with pytest.raises(ValueError):
        stream.below(0)


def test_a_stream_refuses_what_it_cannot_fill():
    stream = seeded_generator(3).mechanism
    with pytest.raises(ValueError, match="contiguous CPU"):
        stream.fill_(torch.empty(4, 4)[:, 0])


def _forbid(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> None:
    """Make every constructor of a seedable generator fail (and say which was called): classes
    stay classes (code annotates with them), their construction raises."""

    def refusing(cls: type, name: str) -> type:
        def __init__(self: object, *args: object, **kwargs: object) -> None:
            calls.append(name)
            raise AssertionError(f"{name} constructed on a secret path")

        return type(f"Refused{cls.__name__}", (cls,), {"__init__": __init__, "__new__": lambda c, *a, **k: __init__(c)})

    def refuse(name: str):
        def constructor(*args: object, **kwargs: object) -> None:
            calls.append(name)
            raise AssertionError(f"{name} constructed on a secret path")

        return constructor

    monkeypatch.setattr(torch, "Generator", refusing(torch.Generator, "torch.Generator"))
    monkeypatch.setattr(np.random, "default_rng", refuse("numpy.random.default_rng"))
    monkeypatch.setattr(np.random, "RandomState", refusing(np.random.RandomState, "numpy.random.RandomState"))
    monkeypatch.setattr(np.random, "Generator", refusing(np.random.Generator, "numpy.random.Generator"))
    monkeypatch.setattr(random, "Random", refusing(random.Random, "random.Random"))


def _global_states() -> tuple[object, ...]:
    return (torch.random.get_rng_state().clone(), np.random.get_state()[1].copy(), random.getstate())


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return torch.equal(a[0], b[0]) and bool((a[1] == b[1]).all()) and a[2] == b[2]  # type: ignore[index,union-attr,attr-defined]


@pytest.mark.parametrize("augmentations", [1, 2])
def test_no_secret_path_uses_a_seedable_generator(monkeypatch, augmentations):
    """A real release under a secret generator: every mechanism's perturb, and DP-SGD steps
    (ghost clipping on a linear model, opacus' hooks on a convolution, augmentation, ScatterNet +
    linear in closed form) with empty
    Poisson batches among them, while the constructors of torch.Generator, numpy's generators and
    random.Random raise, and the global generators' states must not move (nothing draws from
    torch's, numpy's or Python's default generator either)."""
    train = load_dataset("digits")
    models = [
        init_model(name, input_shape=train.input_shape, num_classes=10, seed=0) for name in ("logreg", "digits-cnn")
    ]
    inputs = {
        "unit": torch.linspace(-1, 1, 5000),
        "weights": torch.linspace(-0.2, 0.2, 5000),
        "binary": (torch.arange(5000) % 2).float(),
    }
    mechanisms_ = [
        mechanisms.get("pnpm", epsilon=1.0),
        mechanisms.get("duchi", epsilon=1.0),
        mechanisms.get("pm", epsilon=1.0),
        mechanisms.get("hm", epsilon=2.0),
        mechanisms.get("ldp-fl", epsilon=1.0, radius=0.1),
        mechanisms.get("laplace", epsilon=1.0),
        mechanisms.get("exponential", epsilon=1.0),
        mechanisms.get("rr", epsilon=1.0, k=3),
        mechanisms.get("gaussian", clip_norm=1.0, noise_multiplier=1.0),
        mechanisms.get("sampled", base="pm", epsilon=10.0),
    ]
    scatter = init_model("scatter-linear", input_shape=(1, 28, 28), num_classes=10, seed=0)
    # ScatterNet-shaped features (81 channels of 7 x 7) and labels: public test data, not a draw
    features = torch.linspace(-3, 3, 12 * 81 * 7 * 7).reshape(12, 81, 7, 7).sin() * 2
    labels = torch.arange(12) % 10
    calls: list[str] = []
    before = _global_states()
    _forbid(monkeypatch, calls)
    for mech in mechanisms_:
        kind = "binary" if mech.name == "rr" else "weights" if mech.name in ("pnpm", "gaussian", "ldp-fl") else "unit"
        mech.perturb(inputs[kind], generator=secret_generator())
        mech.perturb(inputs[kind])  # no generator: a fresh secret one
    dp = DPSGDPolicy(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=2, epochs=1)
    for model in models:
        if augmentations > 1 and model is models[0]:
            continue  # augmentation is for image batches
        train_local(
            model,
            train.x[:12],
            train.y[:12],
            epochs=1,
            batch_size=2,
            lr=0.1,
            seed=0,
            dp=dp,
            privacy_generator=secret_generator(),
            augmentations=augmentations,
        )
    if augmentations == 1:  # ScatterNet + linear: its clipped sum in closed form, features made before the check
        train_local(
            scatter,
            features,
            labels,
            epochs=1,
            batch_size=2,
            lr=0.1,
            seed=0,
            dp=dp,
            privacy_generator=secret_generator(),
        )
    monkeypatch.undo()
    assert calls == []
    assert _same(before, _global_states())
