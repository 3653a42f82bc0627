"""The vocab-parallel cross-entropy's kernels (``KernelFusions.cross_entropy``): Megatron's two
keys both ways, the Megatron-LM rule on Transformer Engine's fused kernel, and the HBM bytes
each implementation moves per logit (``training.cross_entropy_work``)."""

from __future__ import annotations

import pytest

from blueprinting.errors import ConfigError
from blueprinting.mapping.flat_keys import FlatValue, from_mapping, to_mapping, to_megatron_args
from blueprinting.mapping.laws import check_training
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    CrossEntropyFusionImpl,
    FusedCrossEntropy,
    TrainingSpec,
    UnfusedCrossEntropy,
)
from blueprinting.synthesizer.dialects.transformer.training import cross_entropy_work

BASE: dict[str, FlatValue] = {"world_size": 8, "global_batch_size": 8, "micro_batch_size": 1}


def _spec(**keys: FlatValue) -> TrainingSpec:
    return from_mapping({**BASE, **keys}, model=model_preset("llama3-8b"))


def test_the_keys_build_the_kernel_and_come_back() -> None:
    assert _spec().mapping.fusions.cross_entropy == UnfusedCrossEntropy()
    # the implementation is read only with the fusion on, as Megatron-Core reads it
    assert _spec(cross_entropy_fusion_impl="te").mapping.fusions.cross_entropy == (
        UnfusedCrossEntropy()
    )
    native = _spec(cross_entropy_loss_fusion=True)
    assert native.mapping.fusions.cross_entropy == FusedCrossEntropy()
    te = _spec(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    assert te.mapping.fusions.cross_entropy == FusedCrossEntropy(impl=CrossEntropyFusionImpl.TE)
    keys = to_mapping(te)
    assert keys["cross_entropy_loss_fusion"] is True
    assert keys["cross_entropy_fusion_impl"] == "te"
    assert "cross_entropy_loss_fusion" not in to_mapping(_spec())
    args = to_megatron_args(native)
    i = args.index("--cross-entropy-loss-fusion")
    assert args[i + 1 : i + 3] == ["--cross-entropy-fusion-impl", "native"]
    assert "--cross-entropy-loss-fusion" not in to_megatron_args(_spec())
    assert str(te.mapping.fusions) == "ce-fused(te)"


def test_megatron_lm_refuses_te_cross_entropy() -> None:
    te = _spec(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    laws = {v.law for v in check_training(te.model, te.mapping)}
    assert laws == {"cross_entropy_te_fusion"}
    assert not check_training(te.model, te.mapping, megatron=False)
    native = _spec(cross_entropy_loss_fusion=True)
    assert not check_training(native.model, native.mapping)


def test_a_bad_implementation_is_refused() -> None:
    with pytest.raises(ConfigError) as raised:
        _spec(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="triton")
    assert "cross_entropy_fusion_impl" in "; ".join(raised.value.problems)


@pytest.mark.parametrize(
    ("kernel", "forward", "backward"),
    [
        # .float() 2+4, max 4, -= 4+4, exp 4+4, sum 4, div_ 4+4; mul_ 4+4, cast back 4+2
        (UnfusedCrossEntropy(), (22, 16), (8, 6)),
        # jit: float+max 2+4, predicted logits 4+4, softmax 4+4; gradients 4+2
        (FusedCrossEntropy(), (10, 12), (4, 2)),
        # Triton: online softmax 2, loss + fp32 gradient 2+4; element_mul 4+4, autograd cast 4+2
        (FusedCrossEntropy(impl=CrossEntropyFusionImpl.TE), (4, 4), (8, 6)),
    ],
)
def test_bytes_per_logit(
    kernel: UnfusedCrossEntropy | FusedCrossEntropy,
    forward: tuple[int, int],
    backward: tuple[int, int],
) -> None:
    logits = 1000
    fw, bw = cross_entropy_work(kernel, logits, 2)
    assert (fw.bytes_read, fw.bytes_written) == (forward[0] * logits, forward[1] * logits)
    assert (bw.bytes_read, bw.bytes_written) == (backward[0] * logits, backward[1] * logits)
    assert (fw.vector_flops, bw.vector_flops) == (4 * logits, 2 * logits)
