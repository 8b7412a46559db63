"""Helpers the tests share: fixtures built from recorded real outputs, fakes for what cannot exist
here (a GPU's NVML), real-process harnesses (two hosts, a Slurm cluster, Chromium), readers of
what torchscale wrote (HTML tables, PDF pages)."""
