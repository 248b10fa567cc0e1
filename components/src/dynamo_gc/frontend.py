"""``python -m dynamo_gc.frontend``: upstream ai-dynamo's frontend with the GC heap frozen.

See :mod:`dynamo_gc.upstream.frontend_cli`.
"""

from dynamo_gc.upstream.frontend_cli import main

if __name__ == "__main__":
    main()
