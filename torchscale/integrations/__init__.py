"""Results into the tools users already live in: TensorBoard and MLflow (optional extras).

Each integration is a :class:`~torchscale.integrations.sinks.ResultSink`: ``benchmark`` feeds it
every cell as it finishes; ``report --format tensorboard`` replays a results folder into one.
"""
