# SPDX-License-Identifier: MIT
"""Mooncake's configuration object, for programs written against Mooncake.

``MooncakeConfig`` has the fields Mooncake's ``mooncake.mooncake_config``
gives it and the same two constructors: ``from_file(path)`` reads a
``mooncake.json`` (the file kvcached's ``--config`` also reads), and
``load_from_env()`` reads the file named by ``$MOONCAKE_CONFIG_PATH``, or,
without it, the ``MOONCAKE_*`` variables.  Sizes may be numbers or
strings with a unit ("4gb", "512MB", "1.5g").  With the kvcache shim on
``PYTHONPATH``, ``from mooncake.mooncake_config import MooncakeConfig``
finds this class.
"""
import json
import os
from dataclasses import dataclass
from typing import Optional

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB, as Mooncake
DEFAULT_LOCAL_BUFFER_SIZE = 1 << 30

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40}


def parse_size(value) -> int:
    """Bytes from an int, or from a string such as "4gb" or "1.5 G"."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    text = str(value).strip().lower()
    number = text.rstrip("kmgtb").strip()
    unit = text[len(text.rstrip("kmgtb")):].strip()
    if not number or unit not in _UNITS:
        raise ValueError(f"not a size: {value!r}")
    return int(float(number) * _UNITS[unit])


def parse_flag(value) -> bool:
    """A yes/no from a bool, a number or a word (true/false, yes/no,
    on/off, 1/0); anything else is an error, not a silent False."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, (int, float)):
        return value != 0
    word = str(value).strip().lower()
    if word in ("", "false", "no", "off", "0", "disable"):
        return False
    if word in ("true", "yes", "on", "1", "enable"):
        return True
    raise ValueError(f"not a yes/no value: {value!r}")


@dataclass
class MooncakeConfig:
    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: Optional[str]
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False  # Mooncake's client HTTP endpoints;
    client_http_port: int = 9300             # kvcached has --metrics-port

    def __post_init__(self) -> None:
        """As Mooncake's: the protocol in lower case, and a clear error for a
        negative size or an empty required field."""
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(f"Invalid protocol: {self.protocol!r}. Protocol must be a "
                             "non-empty string, e.g. 'tcp' or 'rdma'.")
        self.protocol = self.protocol.strip().lower()
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"Invalid {name}: {getattr(self, name)}. "
                                 "Size must be non-negative.")
        for name in ("local_hostname", "metadata_server", "master_server_address"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"Config field {name!r} must be a non-empty string, "
                                 f"got {value!r}.")

    @staticmethod
    def from_file(file_path: str) -> "MooncakeConfig":
        with open(file_path) as f:
            doc = json.load(f)
        missing = [k for k in ("local_hostname", "metadata_server", "master_server_address")
                   if k not in doc]
        if missing:
            raise ValueError(f"Missing required config field: {missing[0]}")
        path = doc.get("ssd_offload_path")
        tenant = doc.get("tenant_id")
        return MooncakeConfig(
            local_hostname=doc["local_hostname"],
            metadata_server=doc["metadata_server"],
            global_segment_size=parse_size(
                doc.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=parse_size(doc.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=doc.get("protocol", "tcp"),
            device_name=doc.get("device_name", ""),
            master_server_address=doc["master_server_address"],
            enable_ssd_offload=parse_flag(doc.get("enable_ssd_offload", False)),
            ssd_offload_path="" if path is None else str(path),
            tenant_id="default" if tenant is None else str(tenant),
            enable_client_http_server=parse_flag(doc.get("enable_client_http_server", False)),
            client_http_port=int(doc.get("client_http_port", 9300)),
        )

    @staticmethod
    def load_from_env() -> "MooncakeConfig":
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path is not None:
            return MooncakeConfig.from_file(path)
        master = os.getenv("MOONCAKE_MASTER")
        if not master:
            raise ValueError("Neither the environment variable 'MOONCAKE_CONFIG_PATH' "
                             "nor 'MOONCAKE_MASTER' is set.")
        env = os.getenv
        return MooncakeConfig(
            local_hostname=env("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            metadata_server=env("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=parse_size(
                env("MOONCAKE_GLOBAL_SEGMENT_SIZE", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=parse_size(env("MOONCAKE_LOCAL_BUFFER_SIZE",
                                             DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=env("MOONCAKE_PROTOCOL", "tcp"),
            device_name=env("MOONCAKE_DEVICE", ""),
            master_server_address=master,
            enable_ssd_offload=parse_flag(env("MOONCAKE_OFFLOAD_ENABLED", "false")),
            ssd_offload_path=env("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=env("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=parse_flag(
                env("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false")),
            client_http_port=int(env("MOONCAKE_CLIENT_HTTP_PORT", "9300")),
        )
