"""Communication benchmarks: collectives and send/recv measured as nccl-tests measures them,
and the tensor-parallel GEMM primitive of the seed's DDLB."""
