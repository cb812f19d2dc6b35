"""The default optimizer steps with torch's fused AdamW kernel, and trains exactly as the for-loop one."""

from __future__ import annotations

import functools

import pytest
import torch

from mlm_adapt.model.module import MaskedLMModule, fastest_kernels


def _module(model_dir, **kwargs) -> MaskedLMModule:
    module = MaskedLMModule(str(model_dir), max_seq_length=64, **kwargs)
    module.trainer = type("T", (), {"estimated_stepping_batches": 100})()  # what configure_optimizers reads
    return module


def test_the_default_optimizer_is_fused_adamw(tiny_model_dir):
    optimizer = _module(tiny_model_dir).configure_optimizers()["optimizer"]
    assert isinstance(optimizer, torch.optim.AdamW)
    assert [g["fused"] for g in optimizer.param_groups] == [True, True]
    assert optimizer._step_supports_amp_scaling  # GradScaler passes its scale to the kernel


@pytest.mark.parametrize("choice", [{"fused": False}, {"foreach": True}, {"foreach": False}])
def test_a_kernel_chosen_in_the_config_is_kept(tiny_model_dir, choice):
    factory = functools.partial(torch.optim.AdamW, lr=1e-3, **choice)
    optimizer = _module(tiny_model_dir, optimizer=factory).configure_optimizers()["optimizer"]
    ((key, value),) = choice.items()
    assert all(g[key] is value for g in optimizer.param_groups)
    assert not any(g["fused"] for g in optimizer.param_groups)


def test_other_optimizers_are_left_alone():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    assert fastest_kernels(optimizer).param_groups[0]["fused"] is None


def test_fused_steps_give_the_for_loop_trajectory(tiny_model_dir, tokenizer):
    torch.manual_seed(0)
    texts = ["北京欢迎你，这本书很好看。"] * 4
    batch = tokenizer(texts, return_tensors="pt", padding="max_length", max_length=24)
    labels = batch["input_ids"].masked_fill(torch.rand(batch["input_ids"].shape) > 0.3, -100)

    def trajectory(fused: bool) -> tuple[list[float], torch.Tensor]:
        module = _module(tiny_model_dir)
        module.model.eval()  # no dropout: both runs see the same function of the parameters
        params = list(module.model.parameters())
        if fused:
            optimizer = fastest_kernels(torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01))
            assert optimizer.param_groups[0]["fused"]
        else:
            optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=False)
        losses = []
        for _ in range(30):
            loss = module.model(**batch, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses, torch.cat([p.detach().flatten() for p in module.model.parameters()])

    loop_losses, loop_params = trajectory(fused=False)
    fused_losses, fused_params = trajectory(fused=True)
    assert loop_losses[-1] < loop_losses[0] - 0.5  # it trains
    assert fused_losses == pytest.approx(loop_losses, rel=1e-5, abs=1e-6)
    assert torch.allclose(fused_params, loop_params, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("choice", [{}, {"fused": True}], ids=["default", "fused_in_config"])
def test_with_clipping_gradscaler_unscales_before_the_fused_step(tiny_model_dir, choice):
    """Lightning clips only gradients it unscaled itself, and refuses a fused step that unscales inside
    (the traceback of configs/domain.yaml under bf16-mixed): with clipping the kernel stays fused, and
    unscaling is left to GradScaler."""
    module = _module(tiny_model_dir, optimizer=functools.partial(torch.optim.AdamW, lr=1e-3, **choice))
    module.trainer.gradient_clip_val = 1.0
    optimizer = module.configure_optimizers()["optimizer"]
    assert all(g["fused"] for g in optimizer.param_groups)
    assert not getattr(optimizer, "_step_supports_amp_scaling", False)


def test_a_clipped_fused_step_under_gradscaler_is_the_clipped_for_loop_step():
    """GradScaler unscales, the gradients are clipped, the fused kernel steps: the for-loop's update."""
    torch.manual_seed(0)
    weights = torch.randn(64, 8)

    def step(fused: bool) -> torch.Tensor:
        param = torch.nn.Parameter(weights.clone())
        optimizer = torch.optim.AdamW([param], lr=1e-2, fused=fused)
        fastest_kernels(optimizer, clipping=True)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        for _ in range(3):
            scaler.scale((param**3).sum()).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_([param], 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        return param.detach()

    torch.testing.assert_close(step(fused=True), step(fused=False), rtol=1e-5, atol=1e-6)
