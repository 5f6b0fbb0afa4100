# Sourced by scripts/lm_eval_check.sh, scripts/serve_bench.sh and scripts/agent_clients.sh.
# wait_serving PID LOG: until `trtspec serve` (PID, writing LOG) prints `serving …` (its models
# ready); it exiting first (a port taken, a model that will not load) stops the script with its error.
wait_serving() {
  local waited=0
  while ! grep -q '^serving ' "$2"; do
    if ! kill -0 "$1" 2> /dev/null; then
      tail -n 3 "$2" >&2; echo "trtspec serve stopped before serving: see $2" >&2; exit 1
    fi
    if [ $((waited += 1)) -gt 600 ]; then echo "trtspec serve not serving after 300 s: see $2" >&2; exit 1; fi
    sleep 0.5
  done
}
