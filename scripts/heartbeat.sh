# Sourced by the build scripts and scripts/step.sh: a cold build (or go vet,
# staticcheck, go test) is silent for minutes, so say it is still going once
# a minute.
#
#   heartbeat_start NAME [DOING]  start saying "NAME: still DOING (N s so far)"
#                                 (DOING defaults to "building")
#   heartbeat_stop                stop (also safe to call when not started)
#
# The ticker kills its own sleep when stopped, or the sleep would hold the
# caller's stderr pipe open for up to a minute after the build.
heartbeat_start() {
	local name="$1" doing="${2:-building}" begin=$SECONDS
	(
		trap 'kill "$nap" 2>/dev/null; exit 0' TERM
		while :; do
			sleep "${V0M3_HEARTBEAT_SECONDS:-60}" &
			nap=$!
			wait "$nap"
			echo "$name: still $doing ($((SECONDS - begin)) s so far)" >&2
		done
	) &
	heartbeat_pid=$!
}

heartbeat_stop() {
	[[ -n "${heartbeat_pid:-}" ]] && kill "$heartbeat_pid" 2>/dev/null
	heartbeat_pid=""
	true
}

# lock_or_wait FD NAME takes the lock on file descriptor FD, saying so and
# keeping a heartbeat while another process (a second make in another
# shell) holds it: waiting for its build is silent for minutes otherwise.
lock_or_wait() {
	local fd="$1" name="$2"
	flock -n "$fd" && return 0
	echo "$name: another build is under way; waiting for it" >&2
	heartbeat_start "$name" "waiting for the other build"
	flock "$fd"
	heartbeat_stop
}
