#!/usr/bin/env bash
# Build the libcni driver offline from Debian's golang-go and golang-github-appc-cni-dev (GOPATH mode,
# no module download): `build.sh OUTPUT`.
set -euo pipefail
out=$(realpath -m "$1")
src=$(dirname "$(realpath "$0")")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/cnidriver"
cp "$src/main.go" "$work/src/cnidriver/"
cd "$work/src/cnidriver"
GOPATH="$work:/usr/share/gocode" GO111MODULE=off GOPROXY=off GOFLAGS= GOCACHE="$work/cache" \
  go build -o "$out" .
echo "built $out"
