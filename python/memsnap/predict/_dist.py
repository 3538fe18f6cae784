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

