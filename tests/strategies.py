"""Hypothesis strategies for Blueprinting values, reusable by every test module.

- :func:`models`: structurally valid models (any positive sizes; laws may fail).
- :func:`training_specs`: structurally valid training specs whose schedule is the one the degrees
  imply, so that ``from_mapping(to_mapping(x)) == x``; laws may fail.
- :func:`lawful_models`, :func:`lawful_training_specs`: specs that satisfy every planner law and
  every Megatron-LM rule (even stage layouts).
- :func:`lawful_inference_specs`: inference specs that satisfy every inference law.
- :func:`expert_grids`, :func:`moe_training_specs`: any expert grid; training specs of a
  mixture-of-experts model with one (laws may fail).
"""

from __future__ import annotations

from dataclasses import replace
from typing import assert_never

from hypothesis import strategies as st

from blueprinting.mapping.model import (
    CapacityFactor,
    Datatype,
    Dropless,
    EmbeddingTying,
    MixtureOfExperts,
    MlpActivation,
    MoeLayerFrequency,
    MoeLayerList,
    Normalization,
    PositionEmbedding,
    RouterScore,
    TokenDropping,
    TransformerModelSpec,
)
from blueprinting.mapping.precision import (
    Fp4Precision,
    Fp8Format,
    Fp8Precision,
    Fp8Recipe,
    HighPrecision,
    TrainingPrecision,
)
from blueprinting.mapping.transformer import (
    DEFAULT_RECOMPUTE_MODULES,
    DENSE_RECOMPUTE_MODULES,
    AllGatherDispatcher,
    AllGatherKV,
    AllReduce,
    AllToAllDispatcher,
    AttentionBackend,
    AttentionKernel,
    BatchSpec,
    CombinedOneForwardOneBackward,
    ContextParallel,
    CpCommunication,
    DataParallel,
    DistributedOptimizer,
    DualPipe,
    DualPipeV,
    EvenStages,
    ExpertParallel,
    FlexBackend,
    FlexDispatcher,
    ForwardOnly,
    FullRecompute,
    FusedAttention,
    HeadAllToAll,
    HierarchicalAllToAllRing,
    InferenceSpec,
    InferenceWorkload,
    InterleavedOneForwardOneBackward,
    NoOptimizerSharding,
    NoRecompute,
    OneForwardOneBackward,
    OptimizerSharding,
    PipelineParallel,
    PipelineSchedule,
    RecomputeMethod,
    RecomputeModule,
    RecomputePolicy,
    ReduceScatterAllGather,
    ReplicaParallel,
    RingExchange,
    SelectiveRecompute,
    ShardedGradients,
    ShardedParameters,
    SingleStage,
    StageLayout,
    TensorCommunication,
    TensorParallel,
    TokenDispatcher,
    TrainingSpec,
    TransformerInferenceMappingSpec,
    TransformerInferenceParallelism,
    TransformerTrainingMappingSpec,
    TransformerTrainingParallelism,
    UnevenStages,
    UnfusedAttention,
    ZeroBubbleH1,
    dispatcher_overlaps,
)

#: from_mapping gives a training model its base datatype; FP8 is the precision recipe.
TRAINING_DATATYPES = (Datatype.BF16, Datatype.FP16, Datatype.FP32)


def training_precisions(*, param_gather: bool = True) -> st.SearchStrategy[TrainingPrecision]:
    gathers = st.booleans() if param_gather else st.just(False)
    return st.one_of(
        st.just(HighPrecision()),
        st.builds(
            Fp8Precision,
            recipe=st.sampled_from(Fp8Recipe),
            format=st.sampled_from(Fp8Format),
            param_gather=gathers,
        ),
        st.builds(Fp4Precision, param_gather=gathers),
    )


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=12)


@st.composite
def models(
    draw: st.DrawFn, datatypes: tuple[Datatype, ...] = TRAINING_DATATYPES
) -> TransformerModelSpec:
    heads = draw(st.integers(1, 64))
    vocab = draw(st.integers(1, 300_000))
    return TransformerModelSpec(
        name=draw(names),
        num_layers=draw(st.integers(1, 200)),
        hidden_size=draw(st.integers(1, 32768)),
        num_attention_heads=heads,
        num_query_groups=draw(st.integers(1, 64)),
        kv_channels=draw(st.integers(1, 256)),
        ffn_hidden_size=draw(st.integers(1, 131072)),
        seq_length=draw(st.integers(1, 131072)),
        vocab_size=vocab,
        padded_vocab_size=vocab + draw(st.integers(0, 2048)),
        activation=draw(st.sampled_from(MlpActivation)),
        normalization=draw(st.sampled_from(Normalization)),
        position_embedding=draw(st.sampled_from(PositionEmbedding)),
        embeddings=draw(st.sampled_from(EmbeddingTying)),
        add_bias_linear=draw(st.booleans()),
        datatype=draw(st.sampled_from(datatypes)),
    )


@st.composite
def optimizer_shardings(draw: st.DrawFn) -> OptimizerSharding:
    kind = draw(st.sampled_from(["none", "optim", "optim_grads", "optim_grads_params"]))
    gather = draw(st.booleans())
    if kind == "optim":
        return DistributedOptimizer(overlap_param_gather=gather)
    if kind == "optim_grads":
        return ShardedGradients(overlap_param_gather=gather)
    if kind == "optim_grads_params":
        return ShardedParameters(overlap_param_gather=gather)
    return NoOptimizerSharding()


@st.composite
def recompute_policies(draw: st.DrawFn, max_layers: int = 64) -> RecomputePolicy:
    kind = draw(st.sampled_from(["none", "selective", "full"]))
    if kind == "selective":
        modules = draw(st.frozensets(st.sampled_from(sorted(DENSE_RECOMPUTE_MODULES)), min_size=1))
        return SelectiveRecompute(modules=modules)
    if kind == "full":
        return FullRecompute(
            method=draw(st.sampled_from(RecomputeMethod)),
            num_layers=draw(st.integers(1, max_layers)),
        )
    return NoRecompute()


@st.composite
def contexts(draw: st.DrawFn) -> ContextParallel:
    """Any cp axis ``to_mapping`` writes back as given (cp = 1 has Megatron's default p2p)."""
    degree = draw(st.integers(1, 16))
    if degree == 1:
        return ContextParallel()
    options: list[CpCommunication] = [
        RingExchange(),
        AllGatherKV(),
        HeadAllToAll(),
        HierarchicalAllToAllRing(
            a2a_size=draw(st.integers(1, 8)), p2p_size=draw(st.integers(1, 8))
        ),
    ]
    return ContextParallel(degree=degree, communication=draw(st.sampled_from(options)))


@st.composite
def training_specs(draw: st.DrawFn) -> TrainingSpec:
    """Round-trippable through flat keys; laws may or may not hold."""
    p = draw(st.integers(1, 16))
    v = draw(st.integers(1, 6))
    schedule: PipelineSchedule
    if v > 1:
        schedule = InterleavedOneForwardOneBackward(
            virtual_stages=v,
            microbatch_group_size=draw(st.none() | st.integers(1, 32)),
            overlap_p2p_comm=draw(st.booleans()),
        )
    elif p > 1:
        pipelined: list[PipelineSchedule] = [OneForwardOneBackward(), ZeroBubbleH1()]
        schedule = draw(st.sampled_from(pipelined))
    else:
        schedule = SingleStage()
    first = draw(st.none() | st.integers(1, 20))
    last = draw(st.none() | st.integers(1, 20))
    layout: StageLayout = (
        EvenStages()
        if first is None and last is None
        else UnevenStages(first_stage_layers=first, last_stage_layers=last)
    )
    communications: list[TensorCommunication] = [AllReduce(), ReduceScatterAllGather()]
    communication = draw(st.sampled_from(communications))
    return TrainingSpec(
        model=draw(models()),
        mapping=TransformerTrainingMappingSpec(
            parallelism=TransformerTrainingParallelism(
                tensor=TensorParallel(degree=draw(st.integers(1, 16)), communication=communication),
                pipeline=PipelineParallel(degree=p, schedule=schedule, layout=layout),
                data=DataParallel(
                    degree=draw(st.integers(1, 64)),
                    optimizer_sharding=draw(optimizer_shardings()),
                    overlap_grad_reduce=draw(st.booleans()),
                ),
                recompute=draw(recompute_policies()),
                context=draw(contexts()),
            ),
            batch=BatchSpec(
                global_batch_size=draw(st.integers(1, 4096)),
                micro_batch_size=draw(st.integers(1, 8)),
            ),
            attention=draw(attention_kernels()),
            precision=draw(training_precisions()),
        ),
    )


def attention_kernels() -> st.SearchStrategy[AttentionKernel]:
    return st.sampled_from(
        [
            FusedAttention(),
            FusedAttention(backend=AttentionBackend.FLASH),
            UnfusedAttention(),
            UnfusedAttention(backend=AttentionBackend.LOCAL),
        ]
    )


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@st.composite
def lawful_models(
    draw: st.DrawFn,
    tensor_degree: int,
    layers_multiple: int,
    datatypes: tuple[Datatype, ...] = tuple(Datatype),
    *,
    replicated_kv: bool = False,
) -> TransformerModelSpec:
    """A model whose block splits over ``tensor_degree`` and whose layer count is a multiple of
    ``layers_multiple`` (p * v); training splits the K/V heads over t, serving
    (``replicated_kv``) may also replicate them (t a multiple of the groups)."""
    t = tensor_degree
    heads = t * draw(st.integers(1, 4))
    groups = draw(
        st.sampled_from(
            [g for g in _divisors(heads) if g % t == 0 or (replicated_kv and t % g == 0)]
        )
    )
    kv = draw(st.sampled_from([8, 16, 32, 64, 128]))
    padded = t * 128 * draw(st.integers(1, 40))
    return TransformerModelSpec(
        name=draw(names),
        num_layers=layers_multiple * draw(st.integers(1, 4)),
        hidden_size=heads * kv,
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=kv,
        ffn_hidden_size=t * draw(st.integers(1, 512)),
        seq_length=t * draw(st.integers(2, 512)),
        vocab_size=padded - draw(st.integers(0, 127)),
        padded_vocab_size=padded,
        activation=draw(st.sampled_from(MlpActivation)),
        normalization=draw(st.sampled_from(Normalization)),
        position_embedding=draw(st.sampled_from(PositionEmbedding)),
        embeddings=draw(st.sampled_from(EmbeddingTying)),
        add_bias_linear=draw(st.booleans()),
        datatype=draw(st.sampled_from(datatypes)),
    )


@st.composite
def lawful_training_specs(draw: st.DrawFn) -> TrainingSpec:
    """Every planner law and Megatron-LM rule holds (even stage layouts)."""
    t = draw(st.sampled_from([1, 2, 4, 8]))
    p = draw(st.integers(1, 8))
    d = draw(st.integers(1, 8))
    mbs = draw(st.integers(1, 2))
    schedule: PipelineSchedule
    v = 1
    if p > 2 and draw(st.booleans()):
        v = draw(st.integers(2, 3))
        group = draw(st.none() | st.integers(p, 2 * p))
        n = p if group is None else group
        m = n * draw(st.integers(1, 3))
        schedule = InterleavedOneForwardOneBackward(
            virtual_stages=v, microbatch_group_size=group, overlap_p2p_comm=draw(st.booleans())
        )
    else:
        m = draw(st.integers(1, 16))
        schedule = SingleStage() if p == 1 else OneForwardOneBackward()
    model = draw(lawful_models(t, p * v, TRAINING_DATATYPES))
    # cp > 1 needs the fused kernel (16-bit) and 2cp | s, t*cp | s (t | s already holds).
    cp = 1 if model.datatype is Datatype.FP32 else draw(st.sampled_from([1, 1, 2, 4]))
    context = ContextParallel()
    if cp > 1:
        model = replace(model, seq_length=model.seq_length * 2 * cp)
        rings: list[CpCommunication] = [RingExchange(), AllGatherKV()]
        context = ContextParallel(degree=cp, communication=draw(st.sampled_from(rings)))
    communication: TensorCommunication = (
        ReduceScatterAllGather() if t > 1 and draw(st.booleans()) else AllReduce()
    )
    sharding = draw(optimizer_shardings())
    overlap_grad = draw(st.booleans())
    if not isinstance(sharding, NoOptimizerSharding) and sharding.overlap_param_gather:
        overlap_grad = True
    # a low-precision param gather needs a sharded optimizer
    precision = draw(
        training_precisions(param_gather=not isinstance(sharding, NoOptimizerSharding))
    )
    recompute = draw(recompute_policies(max_layers=model.num_layers // p))
    if (
        isinstance(precision, Fp8Precision)
        and precision.recipe is Fp8Recipe.DELAYED
        and isinstance(recompute, SelectiveRecompute)
    ):
        # Megatron refuses delayed scaling with these modules (fp8_delayed_scaling_recompute)
        kept = recompute.modules - {RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM}
        recompute = replace(recompute, modules=kept or DEFAULT_RECOMPUTE_MODULES)
    return TrainingSpec(
        model=model,
        mapping=TransformerTrainingMappingSpec(
            parallelism=TransformerTrainingParallelism(
                tensor=TensorParallel(degree=t, communication=communication),
                pipeline=PipelineParallel(degree=p, schedule=schedule),
                data=DataParallel(
                    degree=d, optimizer_sharding=sharding, overlap_grad_reduce=overlap_grad
                ),
                recompute=recompute,
                context=context,
            ),
            batch=BatchSpec(global_batch_size=d * mbs * m, micro_batch_size=mbs),
            # Transformer Engine's fused kernels take 16-bit inputs only (fused_attention_support);
            # context parallelism runs only in them (cp_needs_fused_attention).
            attention=(
                FusedAttention()
                if cp > 1
                else draw(attention_kernels())
                if model.datatype is not Datatype.FP32
                else UnfusedAttention()
            ),
            precision=precision,
        ),
    )


@st.composite
def lawful_inference_specs(draw: st.DrawFn) -> InferenceSpec:
    t = draw(st.sampled_from([1, 2, 4, 8]))
    p = draw(st.integers(1, 8))
    model = draw(lawful_models(t, p, replicated_kv=True))
    prompt = t * draw(st.integers(1, max(1, model.seq_length // (2 * t))))
    generated = draw(st.integers(1, max(1, model.seq_length - prompt)))
    schedule: PipelineSchedule = ForwardOnly() if p > 1 else SingleStage()
    return InferenceSpec(
        model=model,
        mapping=TransformerInferenceMappingSpec(
            parallelism=TransformerInferenceParallelism(
                tensor=TensorParallel(
                    degree=t,
                    communication=ReduceScatterAllGather()
                    if t > 1 and draw(st.booleans())
                    else AllReduce(),
                ),
                pipeline=PipelineParallel(degree=p, schedule=schedule),
                replicas=ReplicaParallel(degree=draw(st.integers(1, 8))),
            ),
            workload=InferenceWorkload(
                batch_size=draw(st.integers(1, 64)),
                prompt_length=prompt,
                generated_tokens=generated,
                kv_cache_datatype=draw(st.sampled_from(Datatype)),
            ),
        ),
    )


# --------------------------------------------------------------------------------------------
# Mixture of experts and the expert grid
# --------------------------------------------------------------------------------------------
@st.composite
def token_dispatchers(draw: st.DrawFn) -> TokenDispatcher:
    kind = draw(st.sampled_from(["alltoall", "allgather", "flex"]))
    if kind == "allgather":
        return AllGatherDispatcher()
    overlap, shared, delay = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    if kind == "alltoall":
        return AllToAllDispatcher(
            overlap=overlap, shared_expert_overlap=shared, delay_wgrad_compute=delay
        )
    return FlexDispatcher(
        backend=draw(st.sampled_from(FlexBackend)),
        overlap=overlap,
        shared_expert_overlap=shared,
        delay_wgrad_compute=delay,
    )


@st.composite
def expert_grids(draw: st.DrawFn, max_degree: int = 64) -> ExpertParallel:
    """Any expert grid (laws may fail)."""
    return ExpertParallel(
        degree=draw(st.integers(1, max_degree)),
        tensor_degree=draw(st.integers(1, 8)),
        dispatcher=draw(token_dispatchers()),
        grouped_gemm=draw(st.booleans()),
    )


@st.composite
def mixtures_of_experts(draw: st.DrawFn, num_layers: int) -> MixtureOfExperts:
    experts = draw(st.integers(1, 512))
    droppings: list[TokenDropping] = [
        Dropless(),
        CapacityFactor(factor=1.25),
        CapacityFactor(factor=1.0, pad_to_capacity=True),
    ]
    dropping = draw(st.sampled_from(droppings))
    pattern = draw(
        st.one_of(
            st.builds(MoeLayerFrequency, every=st.integers(1, 4)),
            st.builds(
                MoeLayerList,
                layers=st.lists(st.booleans(), min_size=num_layers, max_size=num_layers).map(tuple),
            ),
        )
    )
    top_k = draw(st.integers(1, min(experts, 8)))
    return MixtureOfExperts(
        num_experts=experts,
        top_k=top_k,
        # top-1 with softmax scores is refused (Megatron needs --moe-router-pre-softmax)
        score_function=RouterScore.SIGMOID if top_k == 1 else RouterScore.SOFTMAX,
        expert_ffn_hidden_size=draw(st.integers(1, 8192)),
        shared_expert_ffn_hidden_size=draw(st.sampled_from([0, 0, 128, 1408, 2048, 2816])),
        dropping=dropping,
        layer_pattern=pattern,
    )


@st.composite
def moe_training_specs(draw: st.DrawFn) -> TrainingSpec:
    """:func:`training_specs` with a mixture-of-experts model and any expert grid; round-trips
    through flat keys given the model as the base (its MoE keys are the model part's)."""
    spec = draw(training_specs())
    model = replace(
        spec.model,
        feed_forward=draw(mixtures_of_experts(spec.model.num_layers)),
        mtp_num_layers=draw(st.integers(0, 2)),
    )
    experts = draw(expert_grids())
    pipeline = spec.mapping.parallelism.pipeline
    # the EP overlap selects combined 1F1B (training_schedule): the schedule follows it
    schedule = with_ep_overlap(pipeline.schedule, dispatcher_overlaps(experts.dispatcher))
    parallelism = replace(
        spec.mapping.parallelism, experts=experts, pipeline=replace(pipeline, schedule=schedule)
    )
    return TrainingSpec(model=model, mapping=replace(spec.mapping, parallelism=parallelism))


def with_ep_overlap(schedule: PipelineSchedule, overlap: bool) -> PipelineSchedule:
    """The schedule ``from_mapping`` builds from ``schedule``'s keys beside
    ``overlap_moe_expert_parallel_comm = overlap``: combined 1F1B for Megatron's own schedules,
    the planner-only ones unchanged (their laws then report the EP overlap)."""
    if not overlap:
        return schedule
    match schedule:
        case InterleavedOneForwardOneBackward(
            virtual_stages=v, microbatch_group_size=group, overlap_p2p_comm=p2p
        ):
            return CombinedOneForwardOneBackward(
                virtual_stages=v, microbatch_group_size=group, overlap_p2p_comm=p2p
            )
        case SingleStage() | OneForwardOneBackward():
            return CombinedOneForwardOneBackward(virtual_stages=1)
        case (
            CombinedOneForwardOneBackward()
            | ForwardOnly()
            | ZeroBubbleH1()
            | DualPipe()
            | DualPipeV()
        ):
            return schedule
        case _ as unreachable:
            assert_never(unreachable)
