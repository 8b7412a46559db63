"""A stand-in for kubectl (no API server can run here): records its arguments as JSON lines in
``$FAKE_KUBECTL_LOG`` and answers as kubectl does. ``$FAKE_KUBECTL_CLUSTER=0``: no cluster
(kubectl's own connection-refused message). Node 0's pod folder is ``$FAKE_KUBECTL_POD_ROOT``
(``/results`` in the pod): ``logs --follow`` prints progress and pod_entry's ready line, then
waits, as the pod does, until ``exec ... touch`` marks the folder copied."""

import json
import os
import shutil
import sys
import time
from pathlib import Path

args = sys.argv[1:]
with open(os.environ["FAKE_KUBECTL_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
root = Path(os.environ.get("FAKE_KUBECTL_POD_ROOT", "/nonexistent"))


def pod_path(path: str) -> Path:
    return root / Path(path).relative_to("/results")


if args[0] == "version":
    if os.environ.get("FAKE_KUBECTL_CLUSTER") == "0":
        print('{"clientVersion": {"gitVersion": "v1.33.0"}}')
        sys.stderr.write(
            "The connection to the server localhost:8080 was refused - did you specify the "
            "right host or port?\n"
        )
        sys.exit(1)
    print(
        '{"clientVersion": {"gitVersion": "v1.33.0"}, "serverVersion": {"gitVersion": "v1.33.1"}}'
    )
elif args[0] == "apply":
    kind = "trainjob.trainer.kubeflow.org/ts-x"
    print(f"{kind} created (server dry run)" if "--dry-run=server" in args else f"{kind} created")
elif args[0] == "wait":
    print("pod/ts-x-node-0-0-abcde condition met")
elif args[0] == "get":
    # The first time, the controller has not made the pod yet (no output, exit 0, as kubectl).
    log_lines = Path(os.environ["FAKE_KUBECTL_LOG"]).read_text().splitlines()
    asked = [line for line in log_lines if line.startswith('["get"')]
    print("ts-x-node-0-0-abcde ts-x-node-0-0-fghij" if len(asked) > 1 else "", end="")
elif args[0] == "logs" and os.environ.get("FAKE_KUBECTL_POD_FAILS"):
    print("RuntimeError: CUDA error: no kernel image is available for execution on the device")
elif args[0] == "logs":
    ready = next(root.iterdir())
    print("> Running gpt2-tiny on 16 GPUs x 2 nodes (batch 2, fp32)...", flush=True)
    print(f"torchscale-pod: results ready in /results/{ready.name}", flush=True)
    deadline = time.monotonic() + 30
    while not (ready / ".torchscale-copied").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
elif args[0] == "cp":
    source = args[1].split(":", 1)[1]
    shutil.copytree(pod_path(source), args[2], dirs_exist_ok=True)
elif args[0] == "exec":
    command = args[args.index("--") + 1 :]
    assert command[0] == "touch", command
    pod_path(command[1]).touch()
