from dynamo.common.startup_signals import exit_process
from dynamo.frontend.main import main

# The guard matters: preprocess workers are spawned, and a spawned child must not start a
# frontend of its own if it ever re-imports the parent's main module.
if __name__ == "__main__":
    exit_process(main())
