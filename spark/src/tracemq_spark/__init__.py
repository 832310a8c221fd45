"""tracemq reconciliation job (PySpark) over the Parquet trace lake: ``tracemq reconcile``.

Modules: :mod:`~tracemq_spark.job` (the Spark job, run as named stages: ``params``,
``session``, ``input_files``, ``lake_scan``, ``classify``, ``outputs``, ``commit``),
:mod:`~tracemq_spark.cli` (the command),
:mod:`~tracemq_spark.inputs` (subscription history and committed offsets from Redis/Kafka),
:mod:`~tracemq_spark.report` (summary HTML and PNG), :mod:`~tracemq_spark.submit`
(spark-submit entry). The synthetic lake with ground truth that its tests and benchmark run on
is the dev kit's (:mod:`tracemq_devkit.generator`); the job does not need it.
"""
