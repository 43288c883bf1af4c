"""Local training on scikit-learn's digits: it learns, it is reproducible, DP-SGD accounts."""

import math

import pytest
import torch

from mechanisms.randomness import secret_generator, seeded_generator
from mechanisms.record_level import DPSGDPolicy, round_steps
from node.learning.data import load_dataset
from node.learning.models import init_model
from node.learning.train import evaluate, poisson_batches, round_lr, train_local
from node.protocol.blob import flatten

TRAIN = load_dataset("digits")
TEST = load_dataset("digits", split="test")
CHANCE = 0.1


pytestmark = pytest.mark.usefixtures("one_thread")


def fresh(name="digits-cnn", seed=0):
    return init_model(name, input_shape=TRAIN.input_shape, num_classes=10, seed=seed)


def test_sgd_learns_digits_in_seconds():
    # Deterministic (fixed seeds) on one CPU; CPUs differ only in float rounding, which moves a
    # few logits by ~1e-7 (loss differs in the 7th digit between ATen's default and AVX2
    # kernels, accuracy does not). Seen 0.876 on 450 test images: 0.8 is 34 images and ~5
    # binomial standard deviations (sqrt(0.88 * 0.12 / 450) = 0.015) lower.
    model = fresh()
    before, _ = evaluate(model, TEST.x, TEST.y)
    result = train_local(model, TRAIN.x, TRAIN.y, epochs=4, batch_size=32, lr=0.1, momentum=0.5, seed=1)
    accuracy, loss = evaluate(model, TEST.x, TEST.y)
    assert result.num_samples == len(TRAIN) and result.dp_steps == 0
    assert before < 0.3 and accuracy > 0.8 > CHANCE and loss < math.log(10)


def test_logreg_learns():
    model = fresh("logreg")  # seen 0.876; margin as above
    train_local(model, TRAIN.x, TRAIN.y, epochs=5, batch_size=32, lr=0.1, seed=1)
    assert evaluate(model, TEST.x, TEST.y)[0] > 0.8


def test_same_seed_same_bits():
    """Bit-identical by design only on one machine: the same seed, kernels and order of operations."""
    a, b, c = fresh(), fresh(), fresh()
    for model, seed in ((a, 7), (b, 7), (c, 8)):
        train_local(model, TRAIN.x[:300], TRAIN.y[:300], epochs=1, batch_size=16, lr=0.05, seed=seed)
    assert torch.equal(flatten(a)[0], flatten(b)[0]) and not torch.equal(flatten(a)[0], flatten(c)[0])


def test_dpsgd_runs_with_opacus_the_policys_steps():
    n, batch, epochs = 400, 40, 2
    dp = DPSGDPolicy(noise_multiplier=1.1, max_grad_norm=1.0, batch_size=batch, epochs=epochs, delta=1e-5)
    model = fresh()
    keys = list(model.state_dict())

    def dp_train(model, **kwargs):
        return train_local(model, TRAIN.x[:n], TRAIN.y[:n], epochs=epochs, batch_size=batch, lr=0.5, dp=dp, **kwargs)

    first = dp_train(model, seed=0, privacy_generator=secret_generator())
    # exactly the steps the record-level accountant counts for this sample count
    assert first.dp_steps == round_steps(batch, epochs, n)[1] == epochs * math.ceil(n / batch)
    with pytest.raises(ValueError, match="policy's batch size"):
        train_local(
            fresh(),
            TRAIN.x[:n],
            TRAIN.y[:n],
            epochs=1,
            batch_size=batch,
            lr=0.5,
            dp=dp,
            seed=0,
            privacy_generator=secret_generator(),
        )
    # opacus is detached again: same parameter names, no hooks left behind, finite weights.
    assert list(model.state_dict()) == keys
    assert all(not m._forward_hooks and not m._backward_hooks for m in model.modules())
    assert bool(torch.isfinite(flatten(model)[0]).all())
    # Noise and batches come from the privacy generator alone: the same seed with fresh secret
    # generators gives different models; the same seeded generator twice (a simulation) the same.
    runs = []
    for generator in (secret_generator(), secret_generator(), seeded_generator(5), seeded_generator(5)):
        model = fresh()
        dp_train(model, seed=0, privacy_generator=generator)
        runs.append(flatten(model)[0])
    assert not torch.equal(runs[0], runs[1]) and torch.equal(runs[2], runs[3])
    with pytest.raises(ValueError, match="privacy_generator"):
        dp_train(fresh(), seed=0)


def test_empty_poisson_batches_at_batch_1_are_noisy_steps():
    """Batch 1 on 20 records: a Poisson batch is empty with probability (19/20)^20 = 0.36. Every
    step, empty or not, adds noise to every parameter and steps (the accountant counts each one):
    the noise stream gives exactly one Box-Muller pair per two coordinates per step, and the
    model moves on the empty steps too."""
    n = 20
    dp = DPSGDPolicy(noise_multiplier=1.1, max_grad_norm=1.0, batch_size=1, epochs=1)
    rate, steps = round_steps(1, 1, n)
    empty = sum(int(b.numel() == 0) for b in poisson_batches(n, rate, steps, seeded_generator(3).poisson))
    assert 0 < empty < steps  # this seed's batches: some empty, some not
    model = fresh("logreg")
    sizes = [p.numel() for p in model.parameters()]
    generator = seeded_generator(3)
    result = train_local(
        model, TRAIN.x[:n], TRAIN.y[:n], epochs=1, batch_size=1, lr=0.5, seed=0, dp=dp, privacy_generator=generator
    )
    assert result.dp_steps == steps == n
    pairs_per_step = sum((size + size % 2) // 2 for size in sizes)  # per parameter tensor
    assert generator.dpsgd_noise.drawn == steps * pairs_per_step * 16  # two 64-bit words per pair
    assert generator.poisson.drawn == steps * n * 4  # one 32-bit word per record per step
    # an empty batch's step moves the weights by -lr * noise / expected batch, noise N(0, (z C)^2),
    # with ghost clipping (linear models) and with opacus' hooks (convolutions)
    from node.learning.train import _private_optimizer

    for name, ghost in (("logreg", True), ("digits-cnn", False)):
        model = fresh(name)
        before = flatten(model)[0].clone()
        grad_module, optimizer = _private_optimizer(model, dp, 0.5, 0.0, 1, ghost=ghost)
        optimizer.noise_stream = seeded_generator(4).dpsgd_noise
        optimizer.zero_grad(set_to_none=True)
        optimizer.noise_only_step()
        grad_module._close()
        moved = (flatten(model)[0] - before).double()
        d, sd = moved.numel(), 0.5 * 1.1
        assert abs(float(moved.std()) - sd) <= 5 * sd / math.sqrt(2 * d), name  # sd of a sample sd


def test_poisson_batches_have_the_accounted_rate():
    """Each record joins a batch with probability floor(q 2^32)/2^32 <= q: over 400 steps of 500
    records at q = 0.1, the mean batch size is 50 within 5 sd, and every batch is sorted and
    distinct (a subset)."""
    batches = list(poisson_batches(500, 0.1, 400, seeded_generator(6).poisson))
    sizes = torch.tensor([b.numel() for b in batches], dtype=torch.float64)
    assert abs(float(sizes.mean()) - 50) <= 5 * math.sqrt(500 * 0.1 * 0.9 / 400)
    assert all(torch.equal(b, torch.unique(b)) for b in batches)


def test_round_lr_and_errors():
    assert round_lr(0.01, 0.95, 0) == 0.01
    # lr0 * decay**r: a pow within an ulp and one product; any correct order of the same
    # operations stays within 4 roundings
    assert round_lr(0.01, 0.95, 3) == pytest.approx(0.01 * 0.95**3, rel=4 * 2.0**-53, abs=0)
    with pytest.raises(ValueError, match="decay"):
        round_lr(0.01, 1.5, 1)
    with pytest.raises(ValueError, match="epochs"):
        train_local(fresh(), TRAIN.x, TRAIN.y, epochs=0, batch_size=8, lr=0.1, seed=0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        DPSGDPolicy(noise_multiplier=0, max_grad_norm=1, batch_size=8, epochs=1)


def _standard_layout_training(x, y, dtype):
    """The steps train_local takes, written out in the standard layout, in `dtype`."""
    model = init_model("pnpm-cifar10", input_shape=(3, 32, 32), num_classes=10, seed=6).to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    generator = torch.Generator().manual_seed(7)
    for _ in range(2):
        order = torch.randperm(64, generator=generator)
        for start in range(0, 64, 16):
            batch = order[start : start + 16]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x[batch].to(dtype)), y[batch]).backward()
            optimizer.step()
    return model


def test_channels_last_training_matches_standard_layout_and_leaves_it_standard():
    """Training runs in channels-last layout for speed; the result must be the standard-layout
    result up to float rounding, and the parameters come back contiguous (blobs need that).

    Float32 convolutions accumulate in a different order per layout and per CPU (AVX2, AVX512,
    AMD and Intel kernels differ), so neither float32 result is "the" answer: both are compared
    with the same training in float64, and the channels-last path may deviate from it by no more
    than the standard layout's own float32 error in this run (x4), or, if that happens to be tiny
    on this CPU, a probabilistic rounding bound: u * sqrt(longest sum) per step, times the steps,
    times the weights' scale (Higham and Mary 2019: rounding errors of an n-term sum grow as
    sqrt(n) u). A layout bug shows up as errors of the weights' own size, far above either."""
    from node.learning.train import channels_last

    x = torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    y = torch.arange(64) % 10
    fast = init_model("pnpm-cifar10", input_shape=(3, 32, 32), num_classes=10, seed=6)
    train_local(fast, x, y, epochs=2, batch_size=16, lr=0.05, momentum=0.5, seed=7)
    assert all(p.is_contiguous() for p in fast.parameters())
    standard = _standard_layout_training(x, y, torch.float32)
    exact = _standard_layout_training(x, y, torch.float64)
    with torch.no_grad():
        fast_error = max(float((p.double() - q).abs().max()) for p, q in zip(fast.parameters(), exact.parameters()))
        standard_error = max(
            float((p.double() - q).abs().max()) for p, q in zip(standard.parameters(), exact.parameters())
        )
        scale = max(float(q.abs().max()) for q in exact.parameters())
    steps = 2 * 64 // 16
    longest_sum = 16 * 32 * 32  # the first conv's weight gradient sums over batch x height x width
    rounding_bound = torch.finfo(torch.float32).eps * math.sqrt(longest_sum) * steps * scale
    assert fast_error <= max(4 * standard_error, rounding_bound), (fast_error, standard_error, rounding_bound)
    assert standard_error <= scale / 100  # the float64 reference is the same training, not another one
    ref = standard
    with channels_last(ref, x) as x_cl:
        assert x_cl.is_contiguous(memory_format=torch.channels_last)
        assert ref.features[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert ref.features[0].weight.is_contiguous()
