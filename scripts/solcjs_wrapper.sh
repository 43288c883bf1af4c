#!/usr/bin/env bash
# solcjs as a `solc` that py-solc-x can drive: solcjs prints ">>> Cannot retry compilation with
# SMT ..." before its JSON, which breaks JSON parsing, so drop those lines. Its output goes
# through a file, not a pipe: node exits before flushing a pipe and cuts the JSON at 64 KiB. Its
# input too: node makes a piped stdin non-blocking, so reading a standard-JSON input larger than
# the pipe's 64 KiB fails with EAGAIN whenever the writer is a moment behind.
set -u
here=$(cd "$(dirname "$0")" && pwd)
in=$(mktemp)
out=$(mktemp)
trap 'rm -f "$in" "$out"' EXIT
case " $* " in
*" --standard-json "*) cat >"$in" ;;  # the input JSON; other calls (--version) read no input
esac
"${SOLCJS:-$here/../node_modules/.bin/solcjs}" "$@" <"$in" >"$out"
status=$?
grep -v '^>>> ' "$out"
exit $status
