"""``torchscale validate``: is this node ready for DDP?

Each check is a small function returning a :class:`~torchscale.validate.result.CheckResult`:
``software`` (Python, PyTorch, CUDA, driver, NCCL, nsys), ``gpu`` and ``performance`` (NVML
health: inventory, persistence, ECC, retired memory, throttling, temperature, power, PCIe),
``interconnect`` (NVLink, topology matrix), ``system`` (/dev/shm, limits, hostname, environment,
disk) and ``smoke`` (a real torchrun all-reduce). ``runner`` runs them all; ``display`` renders.
"""
