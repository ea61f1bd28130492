#!/usr/bin/env python3
"""Tiny RocketMQ remoting client for the start-up checks of deploy/rocketmq (stdlib only).

Starting a JVM for `mqadmin clusterList` costs 2-4 s of CPU; these checks need one request:

  probe.py brokers NAMESRV_ADDR
      print the broker addresses the NameServer lists (GET_BROKER_CLUSTER_INFO), one a line
  probe.py wait-registered NAMESRV_ADDR BROKER_ADDR [TIMEOUT_S]
      wait until the NameServer lists BROKER_ADDR. A 5.x broker's first registration races
      with its name-server scanner and usually waits for the periodic one, 10 s after start;
      so after a short wait this asks the broker to re-register at once
      (UPDATE_BROKER_CONFIG brokerPermission=6, i.e. read+write, the default, which makes the
      broker call registerBrokerAll synchronously).

Wire format (RemotingCommand): int32 frame length, int32 (serialize type << 24 | header
length), JSON header, body. Exit status 0 = success, 1 = failure (reason on stderr).

A secured instance (env.sh's ROCKETMQ_TLS / ROCKETMQ_ACL; `probe_env` sets these):
  ROCKETMQ_PROBE_CAFILE       connect over TLS, trusting this CA
  ROCKETMQ_PROBE_CERTFILE     ... showing this client certificate (and ROCKETMQ_PROBE_KEYFILE)
  ROCKETMQ_PROBE_ACCESS_KEY   sign requests as this user (AccessKey) ...
  ROCKETMQ_PROBE_SECRET_KEY   ... with this SecretKey: HMAC-SHA1 over the extFields values in
                              key order and the body, Base64 (what bridge/storage/rocketmq/acl.py
                              does; this file stays stdlib-only and importable on its own)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import socket
import ssl
import struct
import sys
import time

GET_BROKER_CLUSTER_INFO = 106
UPDATE_BROKER_CONFIG = 25
SUCCESS = 0
PERM_READ_WRITE = 6


def _ext_fields(body: bytes) -> dict[str, str]:
    access_key = os.environ.get("ROCKETMQ_PROBE_ACCESS_KEY", "")
    secret_key = os.environ.get("ROCKETMQ_PROBE_SECRET_KEY", "")
    if not access_key:
        return {}
    fields = {"AccessKey": access_key}
    content = "".join(fields[k] for k in sorted(fields)).encode() + body
    digest = hmac.new(secret_key.encode(), content, hashlib.sha1).digest()
    fields["Signature"] = base64.b64encode(digest).decode()
    return fields


def _connect(
    host: str, port: int, timeout: float, cafile: str | None, client_cert: tuple[str, str] | None
) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    if cafile is None:
        cafile = os.environ.get("ROCKETMQ_PROBE_CAFILE", "")
    if not cafile:
        return sock
    context = ssl.create_default_context(cafile=cafile)
    if client_cert is None:
        client_cert = (
            os.environ.get("ROCKETMQ_PROBE_CERTFILE", ""),
            os.environ.get("ROCKETMQ_PROBE_KEYFILE", ""),
        )
    if client_cert[0]:
        context.load_cert_chain(client_cert[0], client_cert[1] or None)
    return context.wrap_socket(sock, server_hostname=host)


def request(
    addr: str,
    code: int,
    body: bytes = b"",
    timeout: float = 3.0,
    *,
    cafile: str | None = None,
    client_cert: tuple[str, str] | None = None,
) -> tuple[int, bytes]:
    """Send one request to host:port (over TLS trusting `cafile`, showing `client_cert`
    (certificate file, key file); defaults from the environment, see above); return (response
    code, response body)."""
    host, port = addr.rsplit(":", 1)
    header = json.dumps(
        {
            "code": code,
            "flag": 0,
            "language": "PYTHON",
            "opaque": 1,
            "serializeTypeCurrentRPC": "JSON",
            "version": 0,
            "extFields": _ext_fields(body),
        }
    ).encode()
    frame = struct.pack(">II", 4 + len(header) + len(body), len(header)) + header + body
    with _connect(host, int(port), timeout, cafile, client_cert) as sock:
        sock.settimeout(timeout)
        sock.sendall(frame)
        (length,) = struct.unpack(">I", _read(sock, 4))
        data = _read(sock, length)
    header_len = struct.unpack(">I", data[:4])[0] & 0xFFFFFF
    reply = json.loads(data[4 : 4 + header_len])
    return int(reply.get("code", -1)), data[4 + header_len :]


def _read(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by peer")
        buf += chunk
    return buf


def brokers(
    namesrv: str, *, cafile: str | None = None, client_cert: tuple[str, str] | None = None
) -> list[str]:
    """Broker addresses in the NameServer's cluster table (see `request` for the TLS ones)."""
    code, body = request(namesrv, GET_BROKER_CLUSTER_INFO, cafile=cafile, client_cert=client_cert)
    if code != SUCCESS:
        raise RuntimeError(f"GET_BROKER_CLUSTER_INFO answered code {code}")
    # The body is fastjson with numeric map keys ({0:"127.0.0.1:20911"}), not strict JSON.
    text = body.decode("utf-8", "replace")
    found: list[str] = []
    for part in text.split('"')[1::2]:
        host, _, port = part.rpartition(":")
        if host and port.isdigit() and "." in host and part not in found:
            found.append(part)
    return found


def wait_registered(namesrv: str, broker: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    nudge_at = time.monotonic() + 1.0
    last_error = ""
    while True:
        try:
            if broker in brokers(namesrv):
                return
            last_error = "broker not in the cluster table"
        except (OSError, RuntimeError, ValueError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        if nudge_at and time.monotonic() >= nudge_at:
            try:
                body = f"brokerPermission={PERM_READ_WRITE}\n".encode()
                code, _ = request(broker, UPDATE_BROKER_CONFIG, body, timeout=10)
                if code == SUCCESS:
                    nudge_at = 0.0  # the broker registered synchronously; check again
                    continue
                last_error = f"UPDATE_BROKER_CONFIG answered code {code}"
            except (OSError, ValueError) as exc:
                last_error = f"asking the broker to register: {type(exc).__name__}: {exc}"
            nudge_at = time.monotonic() + 2.0
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"broker {broker} not registered at NameServer {namesrv} "
                f"after {timeout:.0f} s ({last_error})"
            )
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 2 and argv[0] == "brokers":
            print("\n".join(brokers(argv[1])))
            return 0
        if len(argv) in (3, 4) and argv[0] == "wait-registered":
            wait_registered(argv[1], argv[2], float(argv[3]) if len(argv) == 4 else 60.0)
            return 0
    except Exception as exc:
        print(f"probe.py: {exc}", file=sys.stderr)
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
