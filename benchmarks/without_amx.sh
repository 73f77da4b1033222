#!/bin/sh
# Runs a command as on a CPU without AMX (benchmarks/without_amx.c): Linux's grant of the tile state refused to it
# and to every process it starts, whatever library asks.
#
#     benchmarks/without_amx.sh COMMAND [ARGS...]
set -eu
[ "$#" -gt 0 ] || { echo "usage: benchmarks/without_amx.sh COMMAND [ARGS...]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
built=$(mktemp -d)
trap 'rm -rf "$built"' EXIT
${CC:-cc} -O2 -shared -fPIC -Wall -Werror -o "$built/without_amx.so" "$here/without_amx.c" -ldl
LD_PRELOAD="$built/without_amx.so${LD_PRELOAD:+:$LD_PRELOAD}" "$@"
