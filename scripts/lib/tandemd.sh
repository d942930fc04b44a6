# Sourced by the scripts that start their own tandemd (run-main, the e2e and CUDA suite
# drivers, the benchmarks): a free loopback port, and stopping a server started with
# setsid together with its session workers.

# free_port: a port nothing listens on at 127.0.0.1 right now.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null \
    || echo $((20000 + RANDOM % 40000))
}

# stop_tandemd PID: TERM to the server's process group (its broker and workers), KILL after
# 5 s, then reap it. Quiet and always successful (also under set -e), for cleanup traps.
stop_tandemd() {
  local pid=$1
  [[ -n $pid ]] || return 0
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# tandemd_listens PID LOG: waits (up to 30 s) for the server PID, logging to LOG, to say it
# listens; 1 if it exited first or never said so. Ask this before `tandem info ADDR`: free_port's
# port can be taken by another test's server before ours binds it, and then `tandem info` gets
# its answer from that server while ours has died of "Address already in use". The line must
# carry PID ("[tandemd PID info]"): a log reused from an earlier server still holds its line
# until the new process has truncated it.
tandemd_listens() {
  local pid=$1 log=$2 deadline=$((SECONDS + 30))
  while ((SECONDS < deadline)); do
    kill -0 "$pid" 2>/dev/null || return 1
    grep -q "\[tandemd $pid [a-z]*\] tandemd listening on" "$log" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
