# shellcheck shell=bash
# Process helpers shared by the deploy scripts' libraries (redis/lib.sh, haproxy/lib.sh);
# sourced, not run.

# alive PID: a thread of the process has not exited. A zombie counts as gone: the init of a
# container may reap orphans late, and `kill -0` succeeds on a zombie. But every thread is
# looked at: a killed process's main thread turns zombie first, and another one (Redis's in an
# fsync) can still hold the process's files, its listening socket among them, a moment longer.
alive() {
    local states
    states=$(ps -L -o stat= -p "$1" 2>/dev/null) && grep -qv '^Z' <<<"$states"
}
