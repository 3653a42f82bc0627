"""Which datatype and which tensor-core format each costed op runs in: the one place the
precision recipe meets the ops (the scalar plan and the vectorized search both cost blocks
through :mod:`.passes`, so both use this rule).

Only the Transformer Engine linear layers inside each transformer block run their GEMMs in the
recipe's low-precision format: QKV, the attention output projection, FC1 and FC2, all three GEMMs
of each (forward, activation gradient, weight gradient; TE ``docs/features/low_precision_training/
speedups.rst``: "12 GEMMs per dense layer"). The attention core (fused or unfused), the
embedding, the LM head, norms, activation functions, dropout and the loss stay in the model's
datatype (Megatron-LM enters ``fp8_autocast`` per transformer layer, ``fp8_utils.py``
l.832-895 @d98e8a64; TE ``introduction.rst``: "Only linear operations are in lower precision";
``shared/reference/modern_parallelism.md`` 3.2). GEMM outputs return in high precision, so the
HBM traffic of an op is unchanged (an upper bound for the quantized operand reads). Quantization
kernels (amax, casts) are not timed: Transformer Engine fuses most into the norms and activations.
Grouped expert GEMMs (TEGroupedLinear) join the set when MoE is modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

from blueprinting.mapping.model import Datatype
from blueprinting.mapping.precision import GemmFormat, TrainingPrecision, gemm_format
from blueprinting.synthesizer.dialects.transformer.training import SemanticOpName

#: The block's Transformer Engine linear layers (Megatron ``linear_qkv``, ``linear_proj``,
#: ``linear_fc1``, ``linear_fc2``; MLA's down / up projections; the experts' ``GroupedLinear``
#: and the shared experts' linears). The router's gate stays at the base precision (shared
#: reference section 2.1: ``router_gating_linear``, not an FP8 GEMM).
TE_LINEAR_OPS: frozenset[SemanticOpName] = frozenset(
    {
        SemanticOpName.QKV_PROJECTION,
        SemanticOpName.OUTPUT_PROJECTION,
        SemanticOpName.MLP_UP,
        SemanticOpName.MLP_DOWN,
        SemanticOpName.MLA_DOWN_PROJECTION,
        SemanticOpName.MLA_UP_PROJECTION,
        SemanticOpName.EXPERT_FC1,
        SemanticOpName.EXPERT_FC2,
        SemanticOpName.SHARED_EXPERT_UP,
        SemanticOpName.SHARED_EXPERT_DOWN,
    }
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class OpPrecision:
    """The model's datatype and the strategy's recipe, as the costing pass reads them."""

    datatype: Datatype
    recipe: TrainingPrecision

    def gemm_format(self, op: SemanticOpName, *, is_gemm: bool) -> GemmFormat | None:
        """The low-precision format ``op``'s matrix FLOPs run in, or None (the datatype's
        matrix rate): a GEMM of a Transformer Engine linear under an FP8 / FP4 recipe."""
        if not is_gemm or op not in TE_LINEAR_OPS:
            return None
        return gemm_format(self.recipe)
