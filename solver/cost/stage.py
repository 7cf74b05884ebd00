"""What the cost model evaluates: a model slice and stage configurations (scalar and vectorized).

A :class:`ModelSlice` is a contiguous run of Transformer layers, plus the embedding and/or LM head
when the slice is at the start/end of the model. A :class:`StageConfig` is one way to run a slice on
an island (parallel degrees, ZeRO stage, recomputation, offload, micro-batch). :class:`ConfigArrays`
holds many configurations as parallel NumPy arrays so the cost model evaluates them all at once.

Rank layout (Megatron-LM convention, innermost first): tensor parallel (``tp``), then context
parallel (``cp``), then data parallel (``dp``), then pipeline (``pp``). The experts of an MoE
layer run on Megatron-Core's expert grid over the same ``tp * cp * dp`` GPUs of a pipeline rank:
expert tensor parallelism (``expert_tp``, by default ``tp``) innermost, then expert parallelism
(``ep``), then the experts' own data parallelism, ``tp * cp * dp / (expert_tp * ep)`` members
(``megatron/core/parallel_state.py``, ``initialize_model_parallel``: the expert
``RankGenerator`` with order tp-ep-dp-pp). So EP ranks sit ``expert_tp`` apart, and with
``expert_tp = 1`` EP may reach ``tp * cp * dp``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from solver.spec.domain import ModelSpec, Recompute

#: Integer codes of :class:`Recompute` inside :class:`ConfigArrays` (0 none, 1 selective, 2 full).
RECOMPUTE_CODES: tuple[Recompute, ...] = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)


@dataclass(frozen=True)
class ModelSlice:
    """Layers ``layers`` of ``model`` run as one pipeline stage.

    Attributes
    ----------
    model : ModelSpec
        The whole model (shapes).
    layers : int
        Transformer layers in the slice (>= 1).
    has_embedding : bool
        The slice starts the model and holds the input embedding.
    has_head : bool
        The slice ends the model and holds the final norm, LM head and loss.
    """

    model: ModelSpec
    layers: int
    has_embedding: bool = False
    has_head: bool = False

    def __post_init__(self) -> None:
        if self.layers < 1:
            raise ValueError(f"a slice needs at least one layer, got {self.layers}")

    @property
    def is_whole(self) -> bool:
        """The slice is the whole model (a single-stage plan, unless pipelined inside)."""
        return self.has_embedding and self.has_head and self.layers == self.model.layers

    @classmethod
    def whole(cls, model: ModelSpec) -> "ModelSlice":
        """The whole model as one slice (embedding and head included)."""
        return cls(model, model.layers, True, True)


@dataclass(frozen=True)
class StageConfig:
    """One parallel configuration of a stage on a homogeneous island.

    Attributes
    ----------
    tp : int
        Tensor-parallel degree (with sequence parallelism).
    cp : int
        Context-parallel degree (sequence split, ring exchange of K/V).
    ep : int
        Expert-parallel degree (MoE only; divides the experts and ``tp * cp * dp / etp``).
    pp : int
        Pipeline sub-stages inside the island (1F1B between them).
    dp : int
        Data-parallel degree; ``tp * cp * pp * dp`` is the island's GPU count.
    zero : int
        ZeRO stage 0-3 over the ``dp * cp`` data-parallel ranks.
    recompute : Recompute
        Activation recomputation.
    offload : bool
        In-flight activations are kept in host memory (over PCIe) instead of HBM.
    micro_batch : int
        Sequences per micro-batch per data-parallel replica.
    recompute_layers : int | None
        With ``recompute`` FULL, how many layers of each (sub-)stage are recomputed: None, all of
        them (every layer's input kept, every layer recomputed: Megatron's ``uniform`` method
        with ``--recompute-num-layers 1``); ``k``, the first ``k`` layers of each pipeline rank
        (Megatron's ``block`` method with ``--recompute-num-layers k``; FlagScale's
        ``recompute_method_per_stage_micro_batch`` 1 and ``recompute_num_layers_per_stage_
        micro_batch`` k), the others storing their whole activations. A sub-stage of fewer than
        ``k`` layers recomputes all of them. Must be None without FULL.
    expert_tp : int | None
        Expert tensor-parallel degree (Megatron's ``--expert-tensor-parallel-size``, FlagScale's
        ``expert_tensor_parallel_size_per_process_mesh``); None: equal to ``tp``, the runtimes'
        default. Each expert's weights are split ``expert_tp`` ways.
    a2a_overlap : bool
        Megatron-Core's MoE all-to-all overlap (``--overlap-moe-expert-parallel-comm``): one
        micro-batch's forward runs layer by layer beside the previous one's backward, each one's
        dispatch and combine under the other's compute
        (:func:`~solver.cost.a2a_overlap.a2a_overlap_hidden`). Only where the runtime runs it
        (:func:`~solver.cost.runtime.runtime_rules.a2a_overlap_problems`).
    """

    tp: int = 1
    cp: int = 1
    ep: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 0
    recompute: Recompute = Recompute.NONE
    offload: bool = False
    micro_batch: int = 1
    recompute_layers: int | None = None
    expert_tp: int | None = None
    a2a_overlap: bool = False

    def __post_init__(self) -> None:
        if self.expert_tp is not None and self.expert_tp < 1:
            raise ValueError(f"expert_tp must be >= 1, got {self.expert_tp}")
        k = self.recompute_layers
        if k is not None and (self.recompute is not Recompute.FULL or k < 1):
            raise ValueError(f"recompute_layers {k} needs full recomputation and k >= 1 "
                             f"(recompute {self.recompute.value})")

    def recomputed_layers(self, layers: int) -> int:
        """Layers a (sub-)stage of ``layers`` layers recomputes under this configuration."""
        if self.recompute is not Recompute.FULL:
            return 0
        return layers if self.recompute_layers is None else min(self.recompute_layers, layers)

    @property
    def gpus(self) -> int:
        """GPUs the configuration occupies."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def etp(self) -> int:
        """The expert tensor-parallel degree in effect (``expert_tp``, or ``tp``)."""
        return self.tp if self.expert_tp is None else self.expert_tp

    @property
    def expert_dp(self) -> int:
        """Replicas of each expert shard: the expert-data-parallel group's size."""
        return self.tp * self.cp * self.dp // (self.etp * self.ep)


_FLAGS = ("offload", "a2a_overlap")  # the boolean columns of ConfigArrays


@dataclass(frozen=True)
class ConfigArrays:
    """Many :class:`StageConfig` as parallel arrays (same length, broadcastable).

    Attributes
    ----------
    tp, cp, ep, pp, dp, zero, micro_batch : numpy.ndarray
        Integer arrays, as in :class:`StageConfig`.
    recompute : numpy.ndarray
        Integer codes, index into :data:`RECOMPUTE_CODES`.
    offload : numpy.ndarray
        Boolean array.
    recompute_layers : numpy.ndarray | int
        :attr:`StageConfig.recompute_layers` with 0 for None (all layers).
    expert_tp : numpy.ndarray | int
        :attr:`StageConfig.expert_tp` with 0 for None (equal to ``tp``).
    a2a_overlap : numpy.ndarray | bool
        :attr:`StageConfig.a2a_overlap`.
    """

    tp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    zero: np.ndarray
    recompute: np.ndarray
    offload: np.ndarray
    micro_batch: np.ndarray
    recompute_layers: np.ndarray | int = 0
    expert_tp: np.ndarray | int = 0
    a2a_overlap: np.ndarray | bool = False

    @classmethod
    def of(cls, configs: list[StageConfig] | tuple[StageConfig, ...]) -> "ConfigArrays":
        """Arrays holding ``configs`` in order."""
        cols = {f.name: [getattr(c, f.name) for c in configs] for f in fields(StageConfig)}
        cols["recompute"] = [RECOMPUTE_CODES.index(r) for r in cols["recompute"]]
        cols["recompute_layers"] = [k or 0 for k in cols["recompute_layers"]]
        cols["expert_tp"] = [e or 0 for e in cols["expert_tp"]]
        arrays = {k: np.asarray(v, dtype=bool if k in _FLAGS else np.int64)
                  for k, v in cols.items()}
        return cls(**arrays)

    def __len__(self) -> int:
        return int(np.broadcast(*(getattr(self, f.name) for f in fields(self))).size)

    def config(self, i: int) -> StageConfig:
        """The ``i``-th configuration."""
        return self.configs([i])[0]

    def configs(self, index: list[int] | np.ndarray) -> list[StageConfig]:
        """The configurations at ``index``, in order."""
        n = len(self)
        cols = {f.name: np.broadcast_to(getattr(self, f.name), (n,))[np.asarray(index, dtype=int)]
                .tolist() for f in fields(self)}
        return [StageConfig(tp=tp, cp=cp, ep=ep, pp=pp, dp=dp, zero=z, recompute=RECOMPUTE_CODES[r],
                            offload=bool(o), micro_batch=b, recompute_layers=k or None,
                            expert_tp=e or None, a2a_overlap=bool(a))
                for tp, cp, ep, pp, dp, z, r, o, b, k, e, a in zip(
                    cols["tp"], cols["cp"], cols["ep"], cols["pp"], cols["dp"], cols["zero"],
                    cols["recompute"], cols["offload"], cols["micro_batch"],
                    cols["recompute_layers"], cols["expert_tp"], cols["a2a_overlap"])]

    def joined(self, other: "ConfigArrays") -> "ConfigArrays":
        """These configurations followed by ``other``'s."""
        n, m = len(self), len(other)
        return ConfigArrays(**{f.name: np.concatenate([
            np.broadcast_to(getattr(self, f.name), (n,)),
            np.broadcast_to(getattr(other, f.name), (m,))]) for f in fields(self)})

    def take(self, index: np.ndarray) -> "ConfigArrays":
        """The configurations at ``index`` (integer or boolean array)."""
        n = len(self)
        return ConfigArrays(**{f.name: np.broadcast_to(getattr(self, f.name), (n,))[index]
                               for f in fields(self)})


def expert_tp(cfg: ConfigArrays) -> np.ndarray:
    """The expert tensor-parallel degree in effect per configuration (``tp`` where 0)."""
    e = np.asarray(cfg.expert_tp)
    return np.where(e > 0, e, cfg.tp)


def recomputed_layers(cfg: ConfigArrays, layers: np.ndarray) -> np.ndarray:
    """Layers of a (sub-)stage of ``layers`` layers that each configuration recomputes:
    all under full recomputation (``recompute_layers`` 0), ``min(k, layers)`` under the block
    method with ``k``, none otherwise (:attr:`StageConfig.recompute_layers`)."""
    k = np.asarray(cfg.recompute_layers)
    layers = np.asarray(layers)
    full = np.asarray(cfg.recompute) == RECOMPUTE_CODES.index(Recompute.FULL)
    return np.where(full, np.where(k > 0, np.minimum(k, layers), layers), 0)


def substage_layers(layers: int, pp: int) -> np.ndarray:
    """Layers of each of the ``pp`` sub-stages: as even as possible, extra layers going to the
    middle sub-stages first, then to the first; the last (LM head) never gets one."""
    base, rem = divmod(layers, pp)
    out = np.full(pp, base)
    middle_extra = min(rem, max(pp - 2, 0))
    out[1:1 + middle_extra] += 1
    out[0] += rem - middle_extra
    return out


def _middle_split(layers: int, pp: np.ndarray):
    """``(pp, base, rem, middle_extra)`` of :func:`substage_layers`, vectorized: every sub-stage
    gets ``base`` layers, the first ``middle_extra`` middle ones one more, the first the rest."""
    pp = np.asarray(pp)
    base, rem = np.divmod(layers, pp)
    return pp, base, rem, np.minimum(rem, np.maximum(pp - 2, 0))


def split_layers(layers: int, pp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Layers of the first, second and last sub-stage (vectorized :func:`substage_layers`).

    With ``pp == 1`` all three are ``layers``; the second sub-stage holds the most layers among
    the middle ones and the most activations, so it bounds their latency and memory (the
    lighter middle kind, :func:`light_middle`, is weighed for the sync).
    """
    pp, base, rem, middle_extra = _middle_split(layers, pp)
    first = base + (rem - middle_extra)
    second = np.where(pp >= 3, base + (middle_extra > 0), first)
    return np.where(pp == 1, layers, first), second, np.where(pp == 1, layers, base)


def light_middle(layers: int, pp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first middle sub-stage without an extra layer: its layers, its index, and whether
    it exists (some middle sub-stages got an extra layer and some did not).

    Middle sub-stages come in at most these two kinds (:func:`substage_layers`). Latency and
    memory grow with layers and position, so the second sub-stage bounds them; the exposed
    gradient sync does not (a sub-stage whose gradients fit one bucket hides none of it), so
    the lighter kind is weighed too.
    """
    pp, base, _, middle_extra = _middle_split(layers, pp)
    exists = (pp >= 3) & (middle_extra > 0) & (pp - 2 > middle_extra)
    return base, 1 + middle_extra, exists
