"""What the tests share, one copy of each (nothing here is a test).

- the wait for a condition with a deadline, :func:`wait_until` and, on an event loop,
  :func:`wait_until_async`, and the child process :class:`LauncherProcess`: re-exported from
  scripts/launcher_process.py, which the benchmark scripts use too;
- processes.py: the launchers' starters (:func:`start_worker`, :func:`start_frontend`);
- pair.py: HTTP to a real frontend + mock worker pair, and what it must answer;
- answers.py: reading OpenAI answers (errors, server-sent events, streamed text);
- frontend_fakes.py: an in-process frontend in front of a fake v2 worker;
- tiny_model.py: the tiny model's tokenizer (the mock's ``--model``) and its model card;
- clock.py: the fake clock; watched.py: a discovery watcher on it, polled by hand;
- admission.py: requests held in flight at a maintenance's admission gate;
- loop_hog.py: an event loop starved on purpose (load that does not depend on the machine);
- etcd_server.py: a real etcd on loopback (the ``etcd_server`` fixture);
- cycles.py: cyclic garbage watched by a weakref; gc_churn.py: allocation that drives CPython's
  automatic collections by counts, and a ``gc.callbacks`` counter of them;
- gc_trace/sitecustomize.py: logs a child's explicit ``gc.collect()`` calls.
"""

from launcher_process import LauncherProcess, wait_until, wait_until_async

__all__ = ["LauncherProcess", "wait_until", "wait_until_async"]
