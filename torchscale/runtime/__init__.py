"""What every rank process shares, whatever it runs (the training worker, the communication
worker, validate's smoke worker): process-group setup, the worker entry, the MPI environment,
per-rank files and the step clock."""
