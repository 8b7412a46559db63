"""Stand-ins for what cannot exist on a machine without GPUs (NVML answers), built from real
recorded outputs."""
