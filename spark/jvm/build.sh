#!/usr/bin/env bash
# Builds the reconciliation job's JVM code (spark/jvm/src/main/java) into
# spark/src/tracemq_spark/jvm/tracemq-spark-jvm.jar with plain javac and jar, against the Spark
# jars the pyspark wheel ships (no Maven or Gradle: nothing is downloaded). Called by
# `make setup`; without a JDK it says so and the job runs its DataFrame path.
#   spark/jvm/build.sh [PYTHON]     (PYTHON: the venv's interpreter, default .venv/bin/python)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${1:-$here/../../.venv/bin/python}"
out="$here/../src/tracemq_spark/jvm/tracemq-spark-jvm.jar"
if ! command -v javac >/dev/null 2>&1 || ! command -v jar >/dev/null 2>&1; then
  echo "spark/jvm: no javac/jar on PATH: the reconciliation job will run its DataFrame path" >&2
  exit 0
fi
jars="$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
spark_version="$("$python" -c 'import pyspark; print(pyspark.__version__)')"
classes="$(mktemp -d)"
trap 'rm -rf "$classes"' EXIT
mapfile -t sources < <(find "$here/src/main/java" -name '*.java' | sort)
javac --release 17 -Xlint:all,-path,-serial -Werror -d "$classes" -cp "$jars/*" "${sources[@]}"
mkdir -p "$(dirname "$out")"
jar --create --file "$out.tmp" -C "$classes" .
mv "$out.tmp" "$out"
# the Spark it was compiled against: the job uses the jar only on that version
echo "$spark_version" > "${out%.jar}.spark-version"
echo "spark/jvm: built $(realpath --relative-to="$PWD" "$out")"
