#!/usr/bin/env bash
# solcjs as a `solc` that py-solc-x can drive: solcjs prints ">>> Cannot retry compilation with
# SMT ..." before its JSON, which breaks JSON parsing, so drop those lines. Its output goes
# through a file, not a pipe: node exits before flushing a pipe and cuts the JSON at 64 KiB.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"${SOLCJS:-$here/../node_modules/.bin/solcjs}" "$@" >"$out"
status=$?
grep -v '^>>> ' "$out"
exit $status
