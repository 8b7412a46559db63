"""The engine's fault-injection models fail exactly when and where they are told to."""

from __future__ import annotations

from typing import List

import pytest
import torch

from tests.support import fault_models


def forward(spec, batch_size: int = 2) -> torch.nn.Module:
    model = spec.build()
    images, _ = spec.batch(batch_size, torch.device("cpu"))
    model(images)
    return model


def test_oom_model_raises_torch_oom_at_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = fault_models.oom_model(oom_at_batch=4)
    forward(spec, 3)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="batch size 4 >= 4"):
        forward(spec, 4)
    monkeypatch.setenv("TORCHSCALE_TEST_OOM_AT", "2")
    with pytest.raises(fault_models.OutOfMemoryError, match="batch size 2 >= 2"):
        forward(fault_models.oom_model(), 2)


def test_crash_model_crashes_only_its_rank_after_some_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHSCALE_TEST_FAULT_AFTER", "1")
    spec = fault_models.crash_model(rank=1)
    monkeypatch.setenv("RANK", "0")
    model = forward(spec)
    model(torch.randn(2, 3, 32, 32))  # rank 0: never crashes
    monkeypatch.setenv("RANK", "1")
    model = forward(spec)  # the first forward runs
    with pytest.raises(RuntimeError, match=r"^injected crash on rank 1$"):
        model(torch.randn(2, 3, 32, 32))


class SleepCalled(Exception):
    pass


def test_hang_model_sleeps_forever_on_its_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: List[float] = []

    def fake_sleep(seconds: float) -> None:  # break out of the endless loop after a few naps
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise SleepCalled

    monkeypatch.setattr(fault_models.time, "sleep", fake_sleep)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("TORCHSCALE_TEST_FAULT_RANK", "2")
    model = forward(fault_models.hang_model(after_steps=1))
    assert sleeps == []
    with pytest.raises(SleepCalled):
        model(torch.randn(2, 3, 32, 32))
    assert len(sleeps) == 3


def test_slow_rank_model_delays_every_forward_on_its_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: List[float] = []
    monkeypatch.setattr(fault_models.time, "sleep", sleeps.append)
    monkeypatch.setenv("TORCHSCALE_TEST_DELAY_MS", "80")
    monkeypatch.setenv("RANK", "1")
    model = forward(fault_models.slow_rank_model())
    model(torch.randn(2, 3, 32, 32))
    assert sleeps == [0.08, 0.08]
    monkeypatch.setenv("RANK", "0")
    model(torch.randn(2, 3, 32, 32))
    assert sleeps == [0.08, 0.08]


def test_fault_models_load_by_module_path() -> None:
    from torchscale.models.registry import load_model

    spec = load_model("tests.support.fault_models:oom_model", oom_at_batch=8, seq_len=64)
    assert spec.name == "oom-model" and spec.unit == "images"
    with pytest.raises(fault_models.OutOfMemoryError):
        forward(spec, 8)


def test_nan_model_outputs_nan_on_every_rank() -> None:
    spec = fault_models.nan_model()
    images, targets = spec.batch(2, torch.device("cpu"))
    loss = spec.loss(spec.build()(images), targets)
    assert torch.isnan(loss) and spec.name == "nan-model"
