"""``python -m tracemq_spark --from … --to …``: the ``tracemq reconcile`` command."""

from tracemq_spark.cli import main

main()
