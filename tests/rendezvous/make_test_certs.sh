#!/bin/sh
# Writes a throw-away CA, a server certificate for localhost/127.0.0.1 and a
# client certificate (both signed by the CA) into DIR, for the TLS tests.
# Usage: make_test_certs.sh DIR
set -eu
cd "$1"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key ca.key
openssl req -x509 -new -key ca.key -out ca.crt -days 2 -subj /CN=ddprun-test-ca
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > server.ext
printf 'extendedKeyUsage=clientAuth\n' > client.ext
for who in server client; do
  key "$who.key"
  openssl req -new -key "$who.key" -out "$who.csr" -subj "/CN=ddprun-$who"
  openssl x509 -req -in "$who.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -out "$who.crt" -days 2 -extfile "$who.ext" 2>/dev/null
done
# A second CA that signed nothing here: trusting it must not admit anyone.
key other-ca.key
openssl req -x509 -new -key other-ca.key -out other-ca.crt -days 2 -subj /CN=other-ca
