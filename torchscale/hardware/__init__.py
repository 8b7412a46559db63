"""What the node is: device peaks, NVML access, environment capture."""
