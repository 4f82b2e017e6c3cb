"""The calls that can hang, and how the agent survives them: a call into the kernel on a mount (statvfs, the active
probe, a checkpoint walk, a copy) can block for ever in uninterruptible sleep on a dead NFS server or a hung FUSE
daemon, and a library call (NVML, a webhook) can stop answering. :mod:`.blocking` runs the first kind in a helper
process (:mod:`._blocking_worker`, standard library only, and the worker scripts built on it), each with a deadline,
a stuck one abandoned and counted, never waited on; :mod:`.deadline` runs the second on a thread it gives up on after
its deadline, keeping at most one stuck. Every such call of the agent goes through one of them."""
