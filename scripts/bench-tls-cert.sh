#!/usr/bin/env bash
# A throwaway test CA and a server certificate for 127.0.0.1 / localhost, for benchmarking and
# conformance runs over TLS:
#   scripts/bench-tls-cert.sh [DIR]        (default DIR: target/bench-tls)
#   herald serve --tls-cert DIR/server.pem --tls-key DIR/server.key …
#   herald-bench idle --tls-ca DIR/ca.pem --ws wss://127.0.0.1:PORT/ws --api https://127.0.0.1:PORT …
# ECDSA P-256 keys (what a public CA usually issues today); valid 30 days. Never use these keys
# for anything but local tests.
set -euo pipefail
dir="${1:-target/bench-tls}"
mkdir -p "$dir"
cd "$dir"
openssl ecparam -name prime256v1 -genkey -noout -out ca.key
openssl req -x509 -new -key ca.key -sha256 -days 30 -subj "/CN=herald-bench test CA" -out ca.pem
openssl ecparam -name prime256v1 -genkey -noout -out server.ec.key
# rustls reads PKCS#8 as well as SEC1; PKCS#8 is the form every tool agrees on.
openssl pkcs8 -topk8 -nocrypt -in server.ec.key -out server.key
rm server.ec.key
openssl req -new -key server.key -subj "/CN=127.0.0.1" -out server.csr
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 -sha256 \
  -extfile server.ext -out server.pem 2>/dev/null
rm server.csr server.ext
echo "$dir: ca.pem (trust this), server.pem + server.key (give these to herald serve)"
