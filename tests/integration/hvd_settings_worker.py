"""Worker for test_horovod_settings: init_distributed with a config (fusion threshold 1 MiB, cycle time 10 ms),
then STEPS (argv[2], 300 when not given) fused gradient allreduces of 8 small tensors. Rank 0 writes the run's log line and the settings it
records (DistEnv.settings' values and from_environment, horovod_used) as JSON to the file named by argv[1]
(a file, not stdout: horovodrun interleaves the ranks' output mid-line)."""
import json
import os
import sys

from common.runtime.config import DistConfig
from common.runtime.dist import describe, init_distributed


def main() -> int:
    env = init_distributed(DistConfig(fusion_threshold_mb=1, cycle_time_ms=10, hierarchical_allreduce=False))
    import tensorflow as tf

    @tf.function
    def step(x):
        return env.allreduce_gradients([x * i for i in range(8)])

    for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 300):
        step(tf.ones((1000,)))
    if env.is_root:
        out = sys.argv[1]
        with open(out + ".tmp", "w") as f:
            json.dump({"log": describe(env), "settings": env.settings.values,
                       "from_environment": list(env.settings.from_environment), "used": env.horovod_used}, f)
        os.replace(out + ".tmp", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
