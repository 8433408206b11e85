"""GPU memory of resuming from a checkpoint: the fully parallel load's exchange buffers.

A resumed run loads its checkpoint with ``dist_checkpointing.load`` (megatron/training/
checkpointing.py ``_load_global_dist_base_checkpoint``).  The load itself reads into the
model's and optimizer's own tensors: a ShardedTensor that has data is loaded in place
(megatron/core/dist_checkpointing/strategies/torch.py), and the distributed optimizer's
default ``dp_reshardable`` state is its live fp32 main parameters and moments, one piece per
parameter range of the rank's bucket shard (megatron/core/optimizer/distrib_optimizer.py
``sharded_param_state_dp_reshardable``, replica_id = the optimizer instance).

What costs memory is ``--ckpt-fully-parallel-load`` with its default broadcast exchange
(megatron/core/dist_checkpointing/strategies/fully_parallel.py, exchange_utils.py
``exchange_loaded_tensors_broadcast``).  Its group is the data-parallel group with context
parallelism (``--ckpt-fully-parallel-load-process-group dp``) or the expert data-parallel
group (``ep_dp``).  Each rank reads part of the shards, then for every shard that two or more
ranks of the group hold, every rank of the group joins a broadcast.  A rank that does not
hold the shard receives it into a fresh CUDA buffer (``_get_empty_tensor_for_exchange``), and
the broadcast is asynchronous and never waited on.  PyTorch's ProcessGroupNCCL keeps the
tensors of an asynchronous collective (CPU-side stashing, pytorch/pytorch #148590 relanded as
#150398) until the work is waited on; for work nobody waits on, the release comes only once
its watchdog has seen the collective complete, as a safety net rather than at a set time.
Every buffer is allocated when its broadcast is issued, and the broadcasts are issued faster
than they complete, so the received buffers can stay allocated into the first training step.
The estimate counts all of them, an upper bound: in Megatron-LM's CI the multi-instance MoE
rerun on H100 kept all 0.82 GB of them (its peak is the first run's plus exactly these),
and on GB200 43%.

Which shards two or more ranks of the group hold, for ranks numbered as
megatron/core/parallel_state.py numbers them (dense: tp, cp, dp, pp fastest first; experts:
etp, ep, edp, pp):
- dense parameters and a non-distributed optimizer's dense states: every rank of the group
  holds them all, so each rank receives only what it needs, in place;
- expert parameters (and a non-distributed optimizer's expert states): held by the ranks with
  the same expert coordinates (etp, ep), so a group that spans expert ranks receives the
  other experts into buffers;
- distributed-optimizer pieces: one rank per instance holds each (its intra-instance shard
  index), so with two or more instances the other shards of the group arrive in buffers;
- the layer-wise distributed optimizer (Muon) gives every parameter's states to one rank:
  never exchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_estimator.config.typed import EstimatorConfig
from megatron_estimator.model.parameters import ParamTensor
from megatron_estimator.model.states import DTYPE_BYTES, master_param_bytes, moment_bytes


@dataclass(frozen=True)
class ResumeLoad:
    """How a resumed run loads, as far as memory goes."""
    modelled: bool               # the estimate knows this load path
    exchanges: bool              # and it is the fully parallel load's broadcast exchange
    path: str                    # which load path (report/assumptions.py says it): fsdp_dtensor,
                                 # in_place, exchange_algo, fully_reshardable, broadcast
    exchange_algo: str = "broadcast"    # --ckpt-fully-parallel-load-exchange-algo


def resume_load(config: EstimatorConfig) -> ResumeLoad | None:
    """None when the run does not resume; else whether its load's memory is modelled."""
    ckpt = config.checkpoint
    if not config.run.resume.resumes:
        return None
    if config.optimizer.use_megatron_fsdp or ckpt.ckpt_format == "fsdp_dtensor":
        return ResumeLoad(False, False, "fsdp_dtensor")
    if ckpt.ckpt_format not in ("torch_dist", None) or not ckpt.fully_parallel_load:
        return ResumeLoad(True, False, "in_place")
    algo = ckpt.exchange_algo
    if algo != "broadcast":
        return ResumeLoad(False, False, "exchange_algo", algo)
    if loads_optimizer(config) and config.optimizer.use_distributed_optimizer \
            and ckpt.optim_fully_reshardable:
        return ResumeLoad(False, False, "fully_reshardable")
    return ResumeLoad(True, True, "broadcast")


def loads_optimizer(config: EstimatorConfig) -> bool:
    """Megatron loads the optimizer's state unless --no-load-optim or --finetune."""
    return not (config.checkpoint.no_load_optim or config.checkpoint.finetune)


def load_exchange_bytes(config: EstimatorConfig, chunks_tensors: list[list[ParamTensor]]) -> int:
    """Bytes of the fully parallel load's broadcast buffers that one rank of this stage keeps
    into the first step of a resumed run (0 when the run does not resume, or its load does
    not exchange).  ``chunks_tensors``: the stage's tensors, one list per model chunk."""
    load = resume_load(config)
    if load is None or not load.exchanges:
        return 0
    p, prec, opt = config.parallel, config.precision, config.optimizer
    tensors = [t for chunk in chunks_tensors for t in chunk]
    param_bytes = DTYPE_BYTES[prec.params_dtype]
    optimizer = loads_optimizer(config)
    master = master_param_bytes(config)
    expert_weights = sum(t.numel * t.count for t in tensors if t.expert) * param_bytes
    states = {expert: sum(int(t.numel * (master + moment_bytes(config, t))) * t.count
                          for t in tensors if t.expert == expert)
              for expert in (False, True)}
    layer_wise = opt.use_layer_wise_distributed_optimizer
    distributed = opt.use_distributed_optimizer and not layer_wise
    if optimizer and not distributed and not layer_wise:
        expert_weights += states[True]          # replicated like the expert weights themselves
    instances = max(opt.num_distributed_optimizer_instances, 1)
    dense_shards = max(p.dp * p.cp // instances, 1)
    expert_shards = max(p.edp // instances, 1)

    # Ranks of one pipeline stage, numbered from 0: dense coordinates (tp, cp, dp) and expert
    # coordinates (etp, ep, edp) of the same rank.  The rank the estimate stands for is the
    # stage's last (every rank of a stage holds the same amount).
    block = p.tp * p.cp * p.dp
    me = block - 1

    def expert_of(x: int) -> tuple[int, int, int]:
        return x % p.etp, (x // p.etp) % p.ep, x // (p.etp * p.ep)

    if config.checkpoint.load_process_group == "ep_dp":
        group = [x for x in range(block) if expert_of(x)[:2] == expert_of(me)[:2]]
    else:
        group = [x for x in range(me % p.tp, block, p.tp)]
    if len(group) < 2:
        return 0
    holders: dict[tuple, set[int]] = {}
    sizes: dict[tuple, int] = {}
    for x in group:
        et, e, ed = expert_of(x)
        if expert_weights:
            key = ("expert", et, e)
            holders.setdefault(key, set()).add(x)
            sizes[key] = expert_weights
        if optimizer and distributed:
            dense_index = x // p.tp                       # its rank in the data-parallel group with cp
            key = ("dense optimizer", dense_index % dense_shards)
            holders.setdefault(key, set()).add(x)
            sizes[key] = states[False] // dense_shards
            if states[True]:
                key = ("expert optimizer", et, e, ed % expert_shards)
                holders.setdefault(key, set()).add(x)
                sizes[key] = states[True] // expert_shards
    return sum(sizes[key] for key, ranks in holders.items() if len(ranks) >= 2 and me not in ranks)
