#!/usr/bin/env bash
# make-certs.sh DIR [HOST...] - a throwaway certificate authority and the certificates a kiln
# cluster on these hosts needs, for the demo and the tests (real deployments bring their own):
#   DIR/ca.pem, DIR/ca.key            the CA (kilnd --tls-ca, clients --tls-ca / KILN_TLS_CA)
#   DIR/server.pem, DIR/server.key    kilnd's certificate for localhost, 127.0.0.1 and HOST...
#   DIR/agent.pem, DIR/agent.key      a client certificate for agents (mutual TLS)
#   DIR/agent2.pem, DIR/agent2.key    another one (tests: a worker is bound to its certificate)
# Keys are 0600. Certificates are valid for 7 days. Existing files are kept.
set -euo pipefail
dir=${1:?usage: make-certs.sh DIR [HOST...]}
shift
mkdir -p "$dir"
umask 077
cd "$dir"
[ -f ca.pem ] && [ -f server.pem ] && [ -f agent.pem ] && [ -f agent2.pem ] && exit 0

san="DNS:localhost,IP:127.0.0.1"
for h in "$@"; do
  if [[ $h =~ ^[0-9.]+$ ]]; then san="$san,IP:$h"; else san="$san,DNS:$h"; fi
done

openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 7 \
  -subj "/CN=kiln test CA" -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

sign() { # name subject extensions
  openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
  printf '%s\n' "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$1.pem" \
    -days 7 -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
sign server "/CN=kilnd" "subjectAltName=$san
extendedKeyUsage=serverAuth"
sign agent "/CN=kiln-agent" "extendedKeyUsage=clientAuth"
sign agent2 "/CN=kiln-agent-2" "extendedKeyUsage=clientAuth"
rm -f ca.srl
chmod 644 ca.pem server.pem agent.pem agent2.pem
