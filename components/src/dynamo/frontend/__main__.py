if __name__ == "__main__":
    # Before anything heavy: where ai-dynamo is installed this tree must not run at all. (Not
    # in a spawned preprocess worker re-importing this module: its parent has checked.)
    from dynamo.common.coexistence import refuse_beside_upstream

    refuse_beside_upstream("python -m dynamo.frontend")

from dynamo.common.startup_signals import exit_process
from dynamo.frontend.main import main

# The guard matters: preprocess workers are spawned, and a spawned child must not start a
# frontend of its own if it ever re-imports the parent's main module.
if __name__ == "__main__":
    exit_process(main())
