"""The job's S3A settings (``tracemq_spark.session.S3AOptions``) reach the SparkConf a new
session is built with. Unit level: no JVM, and no ``hadoop-aws`` (which this machine lacks)."""

from __future__ import annotations

import pytest
from tracemq_spark.session import S3AOptions, session_conf

ENV = {
    "TRACEMQ_SPARK_S3A_ENDPOINT": "http://seaweed:8333",
    "TRACEMQ_SPARK_S3A_REGION": "us-east-1",
    "TRACEMQ_SPARK_S3A_ACCESS_KEY": "tracemq",
    "TRACEMQ_SPARK_S3A_SECRET_KEY": "secret",
}


def test_the_session_conf_carries_the_s3a_settings_of_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    conf = session_conf(shuffle_partitions=4)
    assert {k: v for k, v in conf.items() if "s3" in k} == {
        # the collector's s3://bucket/prefix is read through S3A as it is
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3a.endpoint": "http://seaweed:8333",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
        "spark.hadoop.fs.s3a.aws.credentials.provider": (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        ),
        "spark.hadoop.fs.s3a.access.key": "tracemq",
        "spark.hadoop.fs.s3a.secret.key": "secret",
    }
    assert conf["spark.sql.shuffle.partitions"] == "4"  # the job's own settings stay


def test_a_cluster_picks_its_credentials_provider_and_virtual_hosts() -> None:
    opts = S3AOptions.from_env(
        {
            "TRACEMQ_SPARK_S3A_CREDENTIALS_PROVIDER": "software.amazon.awssdk.auth.credentials."
            "InstanceProfileCredentialsProvider",
            "TRACEMQ_SPARK_S3A_PATH_STYLE": "false",
            "TRACEMQ_SPARK_S3A_ENDPOINT": "https://s3.eu-west-1.amazonaws.com",
            "TRACEMQ_SPARK_S3A_PACKAGES": "org.apache.hadoop:hadoop-aws:3.4.1",
        }
    )
    assert opts is not None
    conf = session_conf(s3a=opts)
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "false"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith(
        "InstanceProfileCredentialsProvider"
    )
    assert "spark.hadoop.fs.s3a.access.key" not in conf
    assert conf["spark.jars.packages"] == "org.apache.hadoop:hadoop-aws:3.4.1"


def test_no_s3a_settings_without_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ENV:
        monkeypatch.delenv(k, raising=False)
    assert S3AOptions.from_env({}) is None
    assert not any("s3a" in k for k in session_conf())


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"TRACEMQ_SPARK_S3A_ENDPOINT": "seaweed:8333"}, "TRACEMQ_SPARK_S3A_ENDPOINT"),
        ({"TRACEMQ_SPARK_S3A_PATH_STYLE": "yes"}, "TRACEMQ_SPARK_S3A_PATH_STYLE"),
        ({"TRACEMQ_SPARK_S3A_ACCESS_KEY": "a"}, "TRACEMQ_SPARK_S3A_SECRET_KEY"),
        ({"TRACEMQ_SPARK_S3A_ENDPOIN": "http://x:1"}, "TRACEMQ_SPARK_S3A_ENDPOIN"),
    ],
)
def test_a_bad_setting_is_named(env: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        S3AOptions.from_env(env)
