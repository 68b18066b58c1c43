#!/usr/bin/env bash
# Makes sure redis-server is on PATH for the Redis store tests, which start
# their own private server (internal/redistest).
#
# As root, a missing redis-server is installed from the Debian package.
# Otherwise the script stops with the command to run. Without apt-get (not
# Debian/Ubuntu) it stops with a message naming the package to install.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1; then
	exit 0
fi

loud() {
	echo "################################################################" >&2
	for line in "$@"; do echo "### $line" >&2; done
	echo "################################################################" >&2
}

if ! command -v apt-get >/dev/null 2>&1; then
	loud "redis-server is not installed and apt-get is not available." \
		"Install Redis 7 (redis-server) with your package manager, then rerun."
	exit 1
fi

if [ "$(id -u)" -ne 0 ]; then
	loud "redis-server is not installed. The Redis store tests need it. Run:" \
		"  sudo apt-get install -y redis-server" \
		"then rerun make test."
	exit 1
fi

echo "installing redis-server (Debian package)..." >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server >&2 || {
	apt-get update >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server >&2
}
# The package starts a system-wide server on 6379; the tests do not use it.
command -v redis-server >/dev/null
