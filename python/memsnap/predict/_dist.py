"""memsnap.predict._dist -- one rank of a distributed script, alone.

While a :class:`FakeWorld` is active the process is rank ``rank`` of
``world_size``: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` are set (as
torchrun sets them), and ``torch.distributed.init_process_group`` creates
torch's fake process group (``torch.testing._internal.distributed.fake_pg``:
every collective returns at once and moves no data) whatever backend the
script names (``hccl``, ``nccl``, ``gloo``).  Collectives on fake tensors
get their output shapes from ``torch.distributed._tools.fake_collectives``
(the fake implementations torch's MemTracker uses).  So FSDP / DTensor /
tensor-parallel code shards exactly as on rank ``rank`` of the real job and
the prediction is that rank's device memory.

What the real job has on top (communication buffers of HCCL/NCCL, the
collectives' own workspace) is not allocator memory: see ``--reserve``.

DistributedDataParallel needs two things the fake process group does not
give as a real one does:

- its check at construction that every rank has the same parameters
  (``torch.distributed._verify_params_across_processes``,
  torch/csrc/distributed/c10d/reducer.cpp: an allgather of the parameter
  count, each rank's count read back with ``.item()``, then a broadcast of
  rank 0's sizes and strides, copied to the host and compared).  The
  allgather's outputs are fake tensors, which have no value: the count
  reads 0 and the check fails ("DDP expects same model across all
  ranks").  In the fake world every rank runs this rank's script, so the
  check has nothing to compare: while a :class:`FakeWorld` is active it
  is replaced by one that makes the same device allocations and
  collectives and compares nothing;
- the result of a collective's ``Work.get_future()``: a real backend
  (ProcessGroupNCCL / Gloo / HCCL) completes it with the output tensors,
  and DDP's gradient reduction (the default comm hook, comm.cpp
  ``parseHookResult``; the Python hooks of ``ddp_comm_hooks``) takes the
  reduced bucket from it; the fake group's ``FakeWork`` completes it with
  None.  :func:`complete_work` gives the collectives the tracker sees a
  finished ``Work`` whose future holds their output tensors (torch's
  ``_create_work_from_future``, the Work of a Python process group).
"""

from __future__ import annotations

import os


class FakeWorld:
    """Context manager: rank ``rank`` of a fake world of ``world_size``."""

    def __init__(self, world_size: int, rank: int):
        self.world_size, self.rank = world_size, rank
        self._saved_env: dict = {}
        self._saved: list = []

    def __enter__(self):
        import torch.distributed as dist

        if not dist.is_available():
            raise RuntimeError("memsnap.predict: this torch has no torch.distributed; "
                               "--devices needs it")
        if dist.is_initialized():
            raise RuntimeError("memsnap.predict: a process group already exists in this "
                               "process; a distributed prediction needs a fresh one")
        # Registers the "fake" backend and the fake collectives.
        import torch.distributed._tools.fake_collectives  # noqa: F401
        from torch.testing._internal.distributed.fake_pg import FakeStore

        env = {"RANK": self.rank, "LOCAL_RANK": self.rank, "WORLD_SIZE": self.world_size,
               "LOCAL_WORLD_SIZE": self.world_size, "GROUP_RANK": 0,
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
        for k, v in env.items():
            self._saved_env[k] = os.environ.get(k)
            os.environ[k] = str(v)
        c10d = dist.distributed_c10d
        orig = c10d.init_process_group
        world = self

        def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1,
                               rank=-1, store=None, group_name="", pg_options=None,
                               device_id=None, **kwargs):
            from ._device import DEVICE_NAME

            kw = {"timeout": timeout} if timeout is not None else {}
            return orig(backend=f"cpu:fake,cuda:fake,{DEVICE_NAME}:fake", store=FakeStore(),
                        world_size=world.world_size, rank=world.rank,
                        group_name=group_name, **kw)

        for mod in (dist, c10d):
            self._saved.append((mod, "init_process_group", mod.init_process_group))
            mod.init_process_group = init_process_group
        if hasattr(dist, "_verify_params_across_processes"):
            self._saved.append((dist, "_verify_params_across_processes",
                                dist._verify_params_across_processes))
            dist._verify_params_across_processes = _verify_params_across_processes
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist

        for mod, name, value in reversed(self._saved):
            setattr(mod, name, value)
        self._saved = []
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}
        if dist.is_initialized():
            dist.destroy_process_group()
        return False


def _verify_params_across_processes(process_group, tensors, logger=None):
    """DDP's parameter check in the fake world (module docstring): the
    device tensors and collectives of ``verify_params_across_processes``
    (torch/csrc/distributed/c10d/reducer.cpp), without the comparisons."""
    import torch

    if not tensors:
        return
    device = tensors[0].device
    count = torch.tensor([len(tensors)], dtype=torch.long, device=device)
    gathered = [torch.empty_like(count) for _ in range(process_group.size())]
    process_group.allgather([gathered], [count]).wait()
    del count, gathered
    meta = [v for t in tensors for v in (*t.size(), *t.stride())]
    metadata = torch.tensor(meta, dtype=torch.long).to(device)
    process_group.broadcast([metadata]).wait()


def complete_work(func, out):
    """``out`` of the c10d operator ``func`` with its ``Work`` replaced by
    one whose future holds the output tensors, as a real backend's
    (module docstring); any other result as it is."""
    if not (isinstance(out, tuple) and len(out) == 2):
        return out
    tensors, _work = out
    import torch

    if isinstance(tensors, torch.Tensor):  # _allgather_base_, _reduce_scatter_base_
        value = [tensors]
    elif tensors and isinstance(tensors[0], (list, tuple)):  # allgather_: one list per input
        value = list(tensors[0])
    else:
        value = list(tensors)
    fut = torch.futures.Future()
    fut.set_result(value)
    # torch's own Work over a finished future (its wait() returns at once).
    return tensors, torch._C._distributed_c10d._create_work_from_future(fut).boxed()
