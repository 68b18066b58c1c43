#!/usr/bin/env bash
# Runs one step of a make target and says what it is doing: a line naming
# the step before it starts, "NAME: still running (N s so far)" once a
# minute while it runs (a cold tool build, go vet or staticcheck is
# otherwise silent for many minutes), and how long it took. The command's
# output and exit status pass through unchanged.
#
# Usage: scripts/step.sh NAME "what it does" COMMAND [ARG...]
# V0M3_HEARTBEAT_SECONDS changes the interval (default 60).
set -uo pipefail

if (($# < 3)); then
	echo "usage: $0 NAME \"what it does\" COMMAND [ARG...]" >&2
	exit 2
fi
name="$1" what="$2"
shift 2
# shellcheck source=heartbeat.sh
source "$(dirname "${BASH_SOURCE[0]}")/heartbeat.sh"

echo "==> $name: $what" >&2
start=$SECONDS
trap heartbeat_stop EXIT
heartbeat_start "$name" running
"$@"
rc=$?
heartbeat_stop
if ((rc == 0)); then
	echo "==> $name: done in $((SECONDS - start)) s" >&2
else
	echo "==> $name: FAILED (exit $rc) after $((SECONDS - start)) s" >&2
fi
exit "$rc"
